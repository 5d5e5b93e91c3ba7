"""Compile wide_cpu.cpp into a torch extension library, offline, with the C++ compiler on this machine.

torch's own C++ extension loader needs ninja; this is one g++ call against the installed torch's headers
(``torch.utils.cpp_extension.include_paths``) and libraries, cached under ``$WIDE_CPU_CACHE`` (default
``~/.cache/wide-export/cpu``) by a hash of the source, the torch version, the compiler and the flags, written
to a temp file and renamed (two processes compiling at once both end with a whole library)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from wide_export.errors import WideError

SOURCE = Path(__file__).with_name("wide_cpu.cpp")
# -ffp-contract=off: a product and a sum the reference rounds separately stay separate (no fused multiply-add
# where the source has none), so the rotary embedding equals the reference's exactly
FLAGS = ("-O3", "-std=c++20", "-ffp-contract=off", "-fPIC", "-shared", "-fopenmp", "-Wall", "-Wno-unused-function")


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


def library_path() -> Path:
    """The compiled library, built now if this source / torch / compiler has none yet (tens of seconds)."""
    import torch
    from torch.utils import cpp_extension

    cxx = find_compiler()
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False).stdout.split("\n")[0]
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    cmd_flags = [*FLAGS, f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-DTORCH_EXTENSION_NAME=wide_cpu"]
    key = hashlib.sha256("\0".join([SOURCE.read_text(), torch.__version__, version, *cmd_flags]).encode())
    lib = cache_dir() / key.hexdigest()[:16] / "wide_cpu.so"
    if lib.is_file():
        return lib
    lib.parent.mkdir(parents=True, exist_ok=True)
    includes = [f"-I{p}" for p in cpp_extension.include_paths()]
    libdirs = cpp_extension.library_paths()
    links = [f"-L{p}" for p in libdirs] + [f"-Wl,-rpath,{p}" for p in libdirs] + ["-lc10", "-ltorch_cpu", "-ltorch"]
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=lib.parent)
    os.close(fd)
    try:
        proc = subprocess.run([cxx, *cmd_flags, *includes, str(SOURCE), "-o", tmp, *links],
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
            raise RuntimeError(f"compiling {SOURCE.name} with {cxx} failed:\n{tail}")
        os.replace(tmp, lib)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return lib
