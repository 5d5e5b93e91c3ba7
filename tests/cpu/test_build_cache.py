"""The compile cache of the CPU kernels (wide_export/cpu/build.py): nothing in it is loaded unless it is the
user's own and whole; a damaged library is rebuilt once; SIGTERM during the compile leaves no compiler and
no temp file behind.

One library is compiled for the whole module (tens of seconds) and copied into each test's own
$WIDE_CPU_CACHE; a rebuild runs a stand-in compiler that copies that library (or writes junk), so only the
fixture and the SIGTERM test run the real compiler."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import assert_one_line_error
from wide_export.base.errors import WideError

# loads the kernels (compiling them if needed) from the source folder argv[1]
LOAD = ("import sys, pathlib\nfrom wide_export.cpu import build, ops\nbuild.SOURCE_DIR = pathlib.Path(sys.argv[1])\n"
        "print(ops.isa())\n")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(cache folder holding one compiled library, the compiler that built it, the source folder it was built
    from). The sources are a copy of csrc/, the module's build.SOURCE_DIR meanwhile (the key stays the same while
    csrc/ is edited); a subprocess loads with `LOAD`, which points build.SOURCE_DIR at it too."""
    from wide_export.cpu import build

    base = tmp_path_factory.mktemp("built")
    source = base / "csrc"
    shutil.copytree(build.SOURCE_DIR, source)
    frozen, env = pytest.MonkeyPatch(), pytest.MonkeyPatch()
    frozen.setattr(build, "SOURCE_DIR", source)
    try:
        env.setenv("WIDE_CPU_CACHE", str(base / "cache"))
        env.delenv("CXX", raising=False)
        build.library_path()
        env.undo()
        yield base / "cache", build.find_compiler(), source
    finally:
        env.undo()
        frozen.undo()


def _copy(built, tmp_path) -> tuple[Path, Path]:
    """A private copy of the compiled cache: (cache folder, its library)."""
    cache = tmp_path / "cache"
    shutil.copytree(built[0], cache, symlinks=True)
    (lib,) = cache.glob("*/wide_cpu.so")
    return cache, lib


def _fake_compiler(tmp_path, built, body: str) -> tuple[Path, Path]:
    """A stand-in $CXX: `--version` as the real one (so the cache key is the same); a compile is counted in
    the returned log and runs `body` with $out the library to write."""
    log = tmp_path / "compiles.log"
    script = tmp_path / "fake-cxx"
    script.write_text(f"""#!/bin/sh
if [ "$1" = "--version" ]; then exec {built[1]} --version; fi
echo compile >> {log}
out=""; prev=""
for a in "$@"; do [ "$prev" = "-o" ] && out="$a"; prev="$a"; done
{body}
""")
    script.chmod(0o755)
    return script, log


def _compiles(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def _env(cache: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("CXX", "WIDE_CPU_CACHE")}
    return {**env, "WIDE_CPU_CACHE": str(cache), **extra}


def _write_sidecar(lib: Path) -> None:
    """What an attacker (or a stale install) could write: a sidecar that matches the library beside it."""
    data = lib.read_bytes()
    lib.with_name(lib.name + ".json").write_text(json.dumps({"size": len(data),
                                                             "sha256": hashlib.sha256(data).hexdigest()}))


# --- 1. nothing is loaded from a cache another user could have written ---------------------------------------


def _group_writable(path: Path) -> None:
    path.chmod(stat.S_IMODE(os.lstat(path).st_mode) | 0o020)


def _symlinked(path: Path) -> None:
    real = path.with_name(path.name + ".real")
    path.rename(real)
    path.symlink_to(real)


def _other_owner(path: Path) -> None:
    os.lchown(path, 65534, 65534)


DEFECTS = {
    "cache folder group-writable": (lambda c, lib: _group_writable(c)),
    "cache folder a symlink": (lambda c, lib: _symlinked(c)),
    "key folder world-writable": (lambda c, lib: lib.parent.chmod(0o777)),
    "key folder a symlink": (lambda c, lib: _symlinked(lib.parent)),
    "library group-writable": (lambda c, lib: _group_writable(lib)),
    "library a symlink": (lambda c, lib: _symlinked(lib)),
    "cache folder another user's": (lambda c, lib: _other_owner(c)),
    "key folder another user's": (lambda c, lib: _other_owner(lib.parent)),
    "library another user's": (lambda c, lib: _other_owner(lib)),
}


@pytest.mark.parametrize("defect", sorted(DEFECTS))
def test_a_cache_another_user_could_write_is_refused(built, tmp_path, monkeypatch, defect):
    if "another user" in defect and os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    from wide_export.cpu import build

    cache, lib = _copy(built, tmp_path)
    DEFECTS[defect](cache, lib)
    monkeypatch.setenv("WIDE_CPU_CACHE", str(cache))
    monkeypatch.delenv("CXX", raising=False)
    with pytest.raises(WideError) as err:
        build.library_path()
    assert err.value.hint and "WIDE_CPU_CACHE" in err.value.hint, str(err.value)
    assert str(cache) in str(err.value) and "\n" not in str(err.value)


def test_a_planted_library_in_a_shared_cache_never_runs(built, tmp_path):
    """Another local user plants a library (and a matching sidecar) under a world-writable $WIDE_CPU_CACHE at
    the predictable key: the command refuses in one line, and the planted code's constructor never runs."""
    cache, lib = _copy(built, tmp_path)
    marker = tmp_path / "planted-code-ran"
    src = tmp_path / "evil.c"
    src.write_text(f'#include <stdio.h>\n__attribute__((constructor)) static void run(void) '
                   f'{{ FILE *f = fopen("{marker}", "w"); if (f) fclose(f); }}\n')
    lib.unlink()
    subprocess.run([built[1], "-shared", "-fPIC", "-x", "c", str(src), "-o", str(lib)], check=True)
    _write_sidecar(lib)
    for path in (cache, lib.parent, lib):
        path.chmod(0o777)
    res = subprocess.run([sys.executable, "-m", "wide_export", "bench", "kernels", "--device", "cpu", "--preset",
                          "tiny", "--output", str(tmp_path / "out")], capture_output=True, text=True,
                         env=_env(cache), timeout=300)
    assert not marker.exists(), "the planted library was loaded"
    line = assert_one_line_error(res)
    assert "WIDE_CPU_CACHE" in line and not (tmp_path / "out").exists()


def test_a_new_cache_is_private(built, tmp_path, monkeypatch):
    """Created 0700 (folders) by the compile; a whole library is then used as it is, without compiling."""
    from wide_export.cpu import build

    cache = tmp_path / "new" / "cache"
    cxx, log = _fake_compiler(tmp_path, built, f'cp {next(built[0].glob("*/wide_cpu.so"))} "$out"')
    monkeypatch.setenv("WIDE_CPU_CACHE", str(cache))
    monkeypatch.setenv("CXX", str(cxx))
    lib = build.library_path()
    assert _compiles(log) == 1
    for path in (cache, lib.parent):
        assert stat.S_IMODE(os.lstat(path).st_mode) == 0o700, oct(os.lstat(path).st_mode)
    assert os.lstat(lib).st_mode & 0o022 == 0 and sorted(p.name for p in lib.parent.iterdir()) == [
        "wide_cpu.so", "wide_cpu.so.json"]
    assert build.library_path() == lib and _compiles(log) == 1


# --- 2. the key covers every source and header; one compile of all sources makes the one library --------------


def _edits():
    """What may change in the source folder: each file's content (sources and headers alike), a new header."""
    from wide_export.cpu import build

    names = sorted(p.name for p in build.SOURCE_DIR.iterdir() if p.is_file())
    assert any(n.endswith(".h") for n in names) and any(n.endswith(".cpp") for n in names), names
    return [f"edit {n}" for n in names] + ["add a header", "rename a header"]


@pytest.mark.parametrize("edit", _edits())
def test_the_cache_key_covers_every_source_and_header(tmp_path, monkeypatch, edit):
    """A header's content reaches the library through its includes: editing any file of csrc/ (a header as much
    as a .cpp), adding one or renaming one gives another key folder, so the library is compiled anew; the same
    sources give the same key."""
    from wide_export.cpu import build

    src = tmp_path / "csrc"
    shutil.copytree(build.SOURCE_DIR, src)
    monkeypatch.setattr(build, "SOURCE_DIR", src)
    cxx, flags = build.find_compiler(), build.compile_flags()
    before = build.cache_key(cxx, flags)
    assert build.cache_key(cxx, flags) == before
    if edit == "add a header":
        (src / "extra.h").write_text("#pragma once\n")
    elif edit == "rename a header":
        header = next(p for p in sorted(src.iterdir()) if p.suffix == ".h")
        header.rename(header.with_name("renamed_" + header.name))
    else:
        path = src / edit.split(" ", 1)[1]
        path.write_bytes(path.read_bytes() + b"\n// one more line\n")
    assert build.cache_key(cxx, flags) != before, f"{edit}: the same key, so the stale library would be loaded"


def test_one_compile_of_every_source_makes_the_one_library(built, tmp_path, monkeypatch):
    """The compiler runs once, given every csrc/*.cpp (and no header), and writes the one library."""
    from wide_export.cpu import build

    args = tmp_path / "args"
    cxx, log = _fake_compiler(tmp_path, built, f'printf "%s\\n" "$@" > {args}; '
                                               f'cp {next(built[0].glob("*/wide_cpu.so"))} "$out"')
    monkeypatch.setenv("WIDE_CPU_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", str(cxx))
    lib = build.library_path()
    given = args.read_text().splitlines()
    cpps = sorted(str(p) for p in built[2].glob("*.cpp"))
    assert _compiles(log) == 1 and len(cpps) > 1 and sorted(a for a in given if a.endswith(".cpp")) == cpps
    assert not any(a.endswith(".h") for a in given) and given[given.index("-o") + 1].endswith("wide_cpu.so")
    assert lib.name == "wide_cpu.so" and lib.is_file()


# --- 3. a damaged library is rebuilt, once --------------------------------------------------------------------


def _truncate(lib: Path) -> None:
    data = lib.read_bytes()
    lib.write_bytes(data[: len(data) // 2])


def _empty(lib: Path) -> None:
    lib.write_bytes(b"")


def _junk_with_matching_sidecar(lib: Path) -> None:  # passes the size/sha check, fails in the loader
    lib.write_bytes(os.urandom(8192))
    _write_sidecar(lib)


@pytest.mark.parametrize("damage", [_truncate, _empty, _junk_with_matching_sidecar])
def test_a_damaged_library_is_rebuilt(built, tmp_path, damage):
    """Truncated (the loader would SIGBUS on it), empty, or junk the loader refuses: rebuilt once, then the
    kernels load; the next run uses the rebuilt library as it is."""
    cache, lib = _copy(built, tmp_path)
    good = tmp_path / "good.so"
    shutil.copy(lib, good)
    damage(lib)
    cxx, log = _fake_compiler(tmp_path, built, f'cp {good} "$out"')
    for compiles in (1, 1):
        res = subprocess.run([sys.executable, "-c", LOAD, str(built[2])], capture_output=True, text=True,
                             env=_env(cache, CXX=str(cxx)), timeout=300)
        assert res.returncode == 0 and res.stderr == "", (res.returncode, res.stderr[-3000:])
        assert res.stdout.strip().startswith(("avx", "scalar")), res.stdout
        assert _compiles(log) == compiles and lib.read_bytes() == good.read_bytes()


def test_a_library_that_never_loads_is_rebuilt_once_then_one_line(built, tmp_path):
    """A compiler whose output never loads: one rebuild, then one warning line and the dense path."""
    cxx, log = _fake_compiler(tmp_path, built, 'head -c 8192 /dev/urandom > "$out"')
    res = subprocess.run([sys.executable, "-c", LOAD, str(built[2])], capture_output=True, text=True,
                         env=_env(tmp_path / "cache", CXX=str(cxx)), timeout=300)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-3000:]
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: ") and "run dense" in lines[0], lines
    assert res.stdout.strip() == "" and _compiles(log) == 2


def test_a_compile_that_fails_is_one_warning_line_naming_the_error_and_the_log(built, tmp_path):
    """A compiler that exits non-zero: one warning line with its first error and where its whole output is kept,
    then the dense path (no traceback, nothing half-written in the cache)."""
    cxx, log = _fake_compiler(tmp_path, built, 'echo "wide_cpu.cpp:1:1: note: in here"; '
                                               'echo "wide_cpu.cpp:7:3: error: planted failure" >&2; exit 1')
    cache = tmp_path / "cache"
    res = subprocess.run([sys.executable, "-c", LOAD, str(built[2])], capture_output=True, text=True,
                         env=_env(cache, CXX=str(cxx)), timeout=300)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-3000:]
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: ") and "run dense" in lines[0], lines
    assert "error: planted failure" in lines[0] and "compile.log" in lines[0], lines
    (folder,) = cache.iterdir()
    assert sorted(p.name for p in folder.iterdir()) == ["compile.log"]
    assert "planted failure" in (folder / "compile.log").read_text()


# --- 5. SIGTERM during the compile ----------------------------------------------------------------------------


def _live_members(pgid: int) -> list[str]:
    """'pid name' of the live processes of group `pgid`."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            text = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        comm, fields = text[text.index("(") + 1: text.rindex(")")], text[text.rindex(")") + 2:].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:
            found.append(f"{name} {comm}")
    return found


def test_sigterm_during_the_compile_stops_the_compiler_and_leaves_no_temp_file(tmp_path, monkeypatch):
    """The first use compiles; SIGTERM once cc1plus runs: exit 143, no compiler process left in its group, no
    temp file in the cache or in $TMPDIR."""
    from wide_export.cpu.build import find_compiler

    monkeypatch.delenv("CXX", raising=False)
    real = find_compiler()
    pidfile = tmp_path / "cxx.pid"
    cxx = tmp_path / "cxx"
    cxx.write_text(f'#!/bin/sh\n[ "$1" = "--version" ] || echo $$ > {pidfile}\nexec {real} "$@"\n')
    cxx.chmod(0o755)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    cache = tmp_path / "cache"
    proc = subprocess.Popen([sys.executable, "-m", "wide_export", "bench", "kernels", "--device", "cpu",
                             "--preset", "tiny", "--output", str(tmp_path / "out")], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=_env(cache, CXX=str(cxx), TMPDIR=str(tmp)),
                            start_new_session=True)
    pgid = None
    try:
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline and proc.poll() is None:
            if pgid is None and pidfile.exists() and pidfile.read_text().strip():
                try:
                    pgid = os.getpgid(int(pidfile.read_text()))
                except ProcessLookupError:
                    pass
            if pgid is not None and any(m.endswith("cc1plus") for m in _live_members(pgid)):
                break
            time.sleep(0.1)
        assert pgid is not None and proc.poll() is None, "the compiler did not start"
        time.sleep(0.5)  # cc1plus has its temp output open
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        time.sleep(0.5)
        survivors = _live_members(pgid)
        assert survivors == [], f"still running after the command exited: {survivors}"
        assert proc.returncode == 143 and "interrupted (SIGTERM)" in err, (proc.returncode, err[-2000:])
        assert list(tmp.iterdir()) == [], list(tmp.iterdir())
        left = [p for p in cache.rglob("*") if p.parent != cache] if cache.exists() else []  # in a key folder
        assert left == [] and not (tmp_path / "out").exists(), left
    finally:
        if proc.poll() is None:
            proc.kill()
        for group in {g for g in (pgid, proc.pid) if g is not None}:
            try:
                os.killpg(group, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        proc.wait()
