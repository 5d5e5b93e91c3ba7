"""Compile the CPU kernels (the sources in csrc/) into one torch extension library, offline, with the C++ compiler
on this machine.

torch's own C++ extension loader needs ninja; this is one g++ call for every csrc/*.cpp against the installed
torch's headers (``torch.utils.cpp_extension.include_paths``) and libraries, cached under ``$WIDE_CPU_CACHE``
(default ``~/.cache/wide-export/cpu``) by a hash of every file in csrc/ (sources and headers, by name and content),
the torch version, the compiler and the flags.

The cache is loaded into this process, so it must be the user's alone: the cache folder, the key folder, the
library and its sidecar must be owned by the user, not group- or world-writable and not symbolic links
(checked with lstat / O_NOFOLLOW), else UnsafeCache and nothing is loaded. New folders are created 0700.
The sidecar (``wide_cpu.so.json``: size and sha256, written after the compile) is compared before the
loader touches the library: a truncated library would kill the process with SIGBUS, so a library that does
not match is rebuilt, and one the loader still refuses is rebuilt once (`load`).

The compiler runs in its own process group (wide_export.base.childproc: an interrupt stops all of it) with its
temp files in a private folder beside the library, removed on any exit; the library and sidecar are renamed
into place (two processes compiling at once both end with a whole library)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Optional

from wide_export.base.errors import WideError

SOURCE_DIR = Path(__file__).with_name("csrc")  # the kernels' sources (*.cpp) and headers (*.h)
LIBRARY = "wide_cpu.so"
SIDECAR = LIBRARY + ".json"  # {"size": bytes, "sha256": hex} of the library beside it
# -ffp-contract=off: a product and a sum the reference rounds separately stay separate (no fused multiply-add
# where the source has none), so the rotary embedding equals the reference's exactly
FLAGS = ("-O3", "-std=c++20", "-ffp-contract=off", "-fPIC", "-shared", "-fopenmp", "-Wall", "-Wno-unused-function")


class UnsafeCache(WideError):
    """The compile cache holds something another user could have written: nothing in it is loaded."""


def find_compiler() -> str:
    """$CXX, else g++ / c++ / clang++ on PATH; WideError when there is none."""
    for name in filter(None, (os.environ.get("CXX"), "g++", "c++", "clang++")):
        exe = shutil.which(name)
        if exe:
            return exe
    raise WideError("no C++ compiler for the CPU kernels (none of $CXX, g++, c++, clang++ on PATH)",
                    hint="install one (apt install g++) or set CXX")


def cache_dir() -> Path:
    return Path(os.environ.get("WIDE_CPU_CACHE") or Path.home() / ".cache" / "wide-export" / "cpu")


def _check(path: Path, st: os.stat_result, folder: bool) -> None:
    """UnsafeCache unless `path` (its lstat / fstat `st`) is the user's own folder / regular file that only the
    user can write."""
    own = "set WIDE_CPU_CACHE to a folder of your own (default ~/.cache/wide-export/cpu)"
    why = None
    if stat.S_ISLNK(st.st_mode):
        why = "is a symbolic link"
    elif folder and not stat.S_ISDIR(st.st_mode):
        why = "is not a folder"
    elif not folder and not stat.S_ISREG(st.st_mode):
        why = "is not a regular file"
    elif st.st_uid != os.geteuid():
        why = f"belongs to uid {st.st_uid}, not to you (uid {os.geteuid()})"
    elif st.st_mode & 0o022:
        why = f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
        own = f"remove it (rm -r {path}) and run again: it is rebuilt private; or {own}"
    if why:
        raise UnsafeCache(f"refusing to load the CPU kernels: {path} in their compile cache {why}, so another "
                          f"user could have planted code there", hint=own)


def _lstat(path: Path) -> Optional[os.stat_result]:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def _private_dir(path: Path) -> None:
    """`path` as a folder of the user's alone, created 0700 if missing (UnsafeCache if it is not)."""
    if _lstat(path) is None:
        try:
            os.makedirs(path.parent, exist_ok=True)
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError as err:
            raise WideError(f"cannot create the compile cache of the CPU kernels {path}: {err.strerror}",
                            hint="set WIDE_CPU_CACHE to a folder of your own") from None
    _check(path, os.lstat(path), folder=True)


def _read_own(path: Path) -> Optional[bytes]:
    """The bytes of the user's own regular file `path` (None if missing), opened without following a link."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as err:  # ELOOP: a symbolic link
        _check(path, os.lstat(path), folder=False)
        raise WideError(f"cannot read {path} in the compile cache of the CPU kernels: {err.strerror}",
                        hint="remove it and run again, or set WIDE_CPU_CACHE to a folder of your own") from None
    with os.fdopen(fd, "rb") as fh:
        _check(path, os.fstat(fd), folder=False)
        return fh.read()


def _sidecar(data: bytes) -> str:
    return json.dumps({"size": len(data), "sha256": hashlib.sha256(data).hexdigest()})


def _whole(lib: Path) -> bool:
    """Whether `lib` is there and matches its sidecar (both the user's own, else UnsafeCache)."""
    data = _read_own(lib)
    side = _read_own(lib.with_name(SIDECAR))
    if data is None or side is None:
        return False
    try:
        return json.loads(side) == json.loads(_sidecar(data))
    except ValueError:
        return False


def sources() -> list[Path]:
    """The translation units compiled into the library: every csrc/*.cpp, sorted."""
    return sorted(SOURCE_DIR.glob("*.cpp"))


def source_digest() -> str:
    """sha256 of every file under csrc/ (sources, headers, anything a source may include): each one's path
    relative to csrc/ and its bytes, in sorted order; editing, adding, removing or renaming any changes it."""
    digest = hashlib.sha256()
    for path in sorted(p for p in SOURCE_DIR.rglob("*") if p.is_file()):
        name = path.relative_to(SOURCE_DIR).as_posix().encode()
        data = path.read_bytes()
        digest.update(b"%d:%s%d:" % (len(name), name, len(data)) + data)
    return digest.hexdigest()


def cache_key(cxx: str, cmd_flags: list) -> str:
    """The key folder's name: a hash of the sources (source_digest), torch's version, the compiler's `--version`
    line and the flags."""
    import torch

    version = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False).stdout.split("\n")[0]
    key = hashlib.sha256("\0".join([source_digest(), torch.__version__, version, *cmd_flags]).encode())
    return key.hexdigest()[:16]


def compile_flags() -> list:
    import torch

    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return [*FLAGS, f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-DTORCH_EXTENSION_NAME=wide_cpu"]


def library_path(rebuild: bool = False) -> Path:
    """The compiled library, built now (tens of seconds) if this source / torch / compiler has none yet, or
    the one there does not match its sidecar, or `rebuild`."""
    cxx = find_compiler()
    cmd_flags = compile_flags()
    root = cache_dir()
    folder = root / cache_key(cxx, cmd_flags)
    _private_dir(root)
    _private_dir(folder)
    lib = folder / LIBRARY
    if not _whole(lib) or rebuild:
        _compile(cxx, cmd_flags, folder)
    return lib


def _compile(cxx: str, cmd_flags: list, folder: Path) -> None:
    """Compile into a private temp folder in `folder` (also the compiler's TMPDIR), rename the library and
    its sidecar into place; the temp folder is removed on any exit, an interrupt stops the compiler's group."""
    from torch.utils import cpp_extension

    from wide_export.base import childproc
    from wide_export.base.signals import signals_deferred

    includes = [f"-I{p}" for p in cpp_extension.include_paths()]
    libdirs = cpp_extension.library_paths()
    links = [f"-L{p}" for p in libdirs] + [f"-Wl,-rpath,{p}" for p in libdirs] + ["-lc10", "-ltorch_cpu", "-ltorch"]
    for stale in folder.glob(".build-*"):  # left by a compile killed with SIGKILL (an hour is ample for a live one)
        try:
            if time.time() - os.lstat(stale).st_mtime > 3600:
                shutil.rmtree(stale, ignore_errors=True)
        except OSError:
            pass
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=folder))
    try:
        out = work / LIBRARY
        lines: list[str] = []
        code = childproc.run_group([cxx, *cmd_flags, *includes, *map(str, sources()), "-o", str(out), *links],
                                   on_line=lines.append, env={**os.environ, "TMPDIR": str(work)})
        if code != 0:  # one line (the first error the compiler names), the whole log kept for the hint
            first = next((ln.strip() for ln in lines if "error" in ln), (lines or [f"exit status {code}"])[-1])
            log = folder / "compile.log"
            log.write_text("\n".join(lines) + "\n")
            raise WideError(f"compiling the CPU kernels ({SOURCE_DIR}) with {cxx} failed: {first}",
                            hint=f"the compiler's whole output is in {log}; check that {cxx} builds C++20 "
                                 "with OpenMP for this torch, or set CXX to one that does")
        os.chmod(out, 0o755)
        (work / SIDECAR).write_text(_sidecar(out.read_bytes()))
        with signals_deferred():  # both or neither (a reader seeing one of them new rebuilds, harmlessly)
            os.replace(out, folder / LIBRARY)
            os.replace(work / SIDECAR, folder / SIDECAR)
    finally:
        with signals_deferred():
            shutil.rmtree(work, ignore_errors=True)


def load() -> None:
    """Load the library into torch (built first if needed); one the loader refuses is rebuilt once, then
    WideError."""
    import torch

    try:
        torch.ops.load_library(str(library_path()))
        return
    except OSError:
        pass
    lib = library_path(rebuild=True)
    try:
        torch.ops.load_library(str(lib))
    except OSError as err:
        reason = (str(err).splitlines() or ["?"])[0]
        raise WideError(f"the compiled CPU kernels {lib} do not load, even rebuilt ({reason})",
                        hint=f"check the compiler ({find_compiler()}) builds for this torch; remove "
                             f"{lib.parent} to start over") from None
