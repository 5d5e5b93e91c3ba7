"""`wide-export build` speaks while it works and stops everything it started on Ctrl-C / SIGTERM.

A stand-in `cmake` (a Python script) prints what CMake, ninja and the Triton AOT step print and starts a
grandchild standing in for an AOT worker, one that ignores SIGTERM as a busy compiler may: the tests run
in seconds and check that no process of the build outlives the command."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.helpers import signal_when_ready

FAKE_CMAKE = textwrap.dedent("""\
    import os, signal, subprocess, sys, time
    args = sys.argv[1:]
    if "-S" in args:
        build = args[args.index("-B") + 1]
        open(os.path.join(build, "CMakeCache.txt"), "w").write("cache")
        print("-- Configuring done", flush=True)
        sys.exit(0)
    build = args[args.index("--build") + 1]
    worker = subprocess.Popen([sys.executable, "-c",
                               "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"])
    with open(os.environ["FAKE_CMAKE_PIDS"], "a") as fh:
        fh.write(f"{os.getpid()} {worker.pid}\\n")
    os.makedirs(os.path.join(build, "aot"), exist_ok=True)
    open(os.path.join(build, "aot", "wide_aot.bin.tmp"), "w").write("half")
    print("[1/3] Compiling the Triton kernels ahead of time for sm 80", flush=True)
    print("aot: compiling 4 Triton kernel specializations for sm_80 (2 processes)", flush=True)
    print("aot: compiler process ready", flush=True)
    print("aot: compiler process ready", flush=True)
    for i in range(1, 5):
        print(f"aot: {i}/4 compiled ({i} s)", flush=True)
        time.sleep(0.02)
    if os.environ.get("FAKE_CMAKE_HANG"):
        time.sleep(300)
    worker.kill()
    os.remove(os.path.join(build, "aot", "wide_aot.bin.tmp"))
    print("[2/3] Building CUDA object kernels/CMakeFiles/wide_kernels_obj.dir/src/wide_kernels.cu.o", flush=True)
    print("[3/3] Linking CXX shared library lib/libwide_kernels.so", flush=True)
    os.makedirs(os.path.join(build, "lib"), exist_ok=True)
    open(os.path.join(build, "lib", "libwide_kernels.so"), "w").write("")
""")


def _cli(tmp_path: Path) -> list[str]:
    script = tmp_path / "fake_cmake.py"
    script.write_text(FAKE_CMAKE)
    exe = tmp_path / "cmake"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} {script} \"$@\"\n")
    exe.chmod(0o755)
    patch = (f"import wide_export.native.build as b; b.find_cmake = lambda: {str(exe)!r}; "
             "b.find_nvcc = lambda: '/bin/true'; from wide_export.cli import main; main()")
    return [sys.executable, "-c", patch, "build"]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_build_prints_one_line_per_stage_when_piped(tmp_path):
    build = tmp_path / "native"
    env = {**os.environ, "FAKE_CMAKE_PIDS": str(tmp_path / "pids"), "WIDE_PROGRESS_DELAY": "0"}
    done = subprocess.run([*_cli(tmp_path), "--build-dir", str(build)], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert lines[:7] == ["build: configure (cmake)", "build: build (cmake)", "build: aot: Triton kernels",
                         "build: aot: starting compiler processes 0/2", "build: aot: Triton kernels 0/4",
                         "build: nvcc 2/3", "build: link 3/3"], done.stderr
    assert "built" in done.stdout and "libwide_kernels.so" in done.stdout
    assert "aot: 4/4 compiled" in (build / "build.log").read_text()  # the full output still goes to the log


def test_build_output_parser_reads_ninja_make_and_aot_lines():
    from wide_export.native.build import BuildOutput

    seen = []
    parse = BuildOutput("build", lambda *a: seen.append(a))
    for line in ["aot: compiling 272 Triton kernel specializations for sm_80, sm_90 (2 processes)",
                 "aot: compiler process ready", "aot: compiler process ready",
                 "aot: 17/272 compiled (40 s)", "[ 40%] Building CXX object trt/CMakeFiles/p.dir/a.cpp.o",
                 "[ 90%] Linking CXX shared library lib/libwide_trt_plugins.so", "-- noise"]:
        parse(line)
    assert seen == [("build (cmake)", None, None), ("aot: starting compiler processes", 0, 2),
                    ("aot: starting compiler processes", 1, 2), ("aot: starting compiler processes", 2, 2),
                    ("aot: Triton kernels", 0, 272), ("aot: Triton kernels", 17, 272),
                    ("c++", 40, 100), ("link", 90, 100)]


def test_the_compiler_processes_say_when_they_are_ready(capsys, monkeypatch):
    """The bar stayed at `0/264` for the ~30 s the compiler processes took to start."""
    from wide_export.kernels import aot
    from wide_export.native.build import BuildOutput

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    aot._worker_ready()
    assert capsys.readouterr().out == "aot: compiler process ready\n"
    assert "TRITON_INTERPRET" not in os.environ  # compiled mode in the compiler processes
    assert aot.WORKER_READY == BuildOutput.AOT_READY


def _interrupt_build(tmp_path, build: Path, sig) -> tuple[int, str, list[int]]:
    pids_file = tmp_path / "pids"
    env = {**os.environ, "FAKE_CMAKE_PIDS": str(pids_file), "FAKE_CMAKE_HANG": "1", "WIDE_PROGRESS_DELAY": "0"}
    code, err = signal_when_ready([*_cli(tmp_path), "--build-dir", str(build)],
                                  lambda err: pids_file.is_file() and "aot" in err, sig, env=env, timeout=60,
                                  settle=0.2, wait=60)
    return code, err, [int(p) for p in pids_file.read_text().split()]


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["ctrl-c", "sigterm"])
def test_interrupted_build_stops_every_process_and_removes_a_fresh_build_folder(tmp_path, sig, code):
    build = tmp_path / "native"
    returncode, err, pids = _interrupt_build(tmp_path, build, sig)
    try:
        assert returncode == code, err
        assert "Traceback" not in err
        last = err.strip().splitlines()[-1]
        assert last == (f"interrupted ({signal.Signals(sig).name}); stopped the build and its compilers; "
                        f"removed {build.resolve()}"), err
        assert not build.exists()
        assert [p for p in pids if _alive(p)] == []  # cmake and the SIGTERM-ignoring worker alike
    finally:
        for p in pids:
            if _alive(p):
                os.kill(p, signal.SIGKILL)


def test_interrupted_rebuild_keeps_the_existing_build_folder_without_temp_files(tmp_path):
    build = tmp_path / "native"
    (build / "lib").mkdir(parents=True)
    (build / "lib" / "libwide_kernels.so").write_text("an earlier build")
    returncode, err, pids = _interrupt_build(tmp_path, build, signal.SIGINT)
    try:
        assert returncode == 130, err
        assert "keeps what finished before" in err.strip().splitlines()[-1]
        assert (build / "lib" / "libwide_kernels.so").read_text() == "an earlier build"
        assert list((build / "aot").glob("*.tmp")) == []
        assert [p for p in pids if _alive(p)] == []
    finally:
        for p in pids:
            if _alive(p):
                os.kill(p, signal.SIGKILL)


def test_piped_progress_prints_only_stages_that_take_long(monkeypatch):
    """Piped, a stage is printed once it has run WIDE_PROGRESS_DELAY seconds: a quick one (or a bad input
    found at once, whose error must stay the only line) prints nothing."""
    import io

    from rich.console import Console

    from wide_export.base.progress import Steps

    monkeypatch.setenv("WIDE_PROGRESS_DELAY", "0.3")
    out = io.StringIO()
    with Steps("job", console=Console(file=out, force_terminal=False)) as steps:
        steps.update("quick")
        steps.update("slow", 1, 10)
        time.sleep(0.2)
        steps.update("slow", 2, 10)
        time.sleep(0.6)
        steps.update("slow", 3, 10)  # within `every` (30 s) of the printed line: not printed
        steps.say("window 1/2, layer 1/3")
    assert out.getvalue().splitlines() == ["job: slow 2/10"]


@pytest.mark.slow
def test_a_real_build_interrupted_while_compiling_leaves_no_process_and_no_folder(tmp_path):
    """The real CMake / ninja / Triton AOT build (nvcc needed), interrupted as a terminal does it: SIGINT to
    the whole foreground group once the AOT stage runs. Progress was printed, exit 130 with one line, no
    process of the build left (ninja, the AOT compiler and its workers), the fresh build folder gone."""
    import shutil

    from wide_export.native.build import find_nvcc

    if find_nvcc() is None or shutil.which("cmake") is None:
        pytest.skip("needs nvcc and cmake")
    build = tmp_path / "native"

    def of_the_build() -> list[str]:
        found = []
        for entry in Path("/proc").iterdir():
            try:
                if not entry.name.isdigit() or int(entry.name) == os.getpid():
                    continue
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                if (str(build) in cmd or "wide_export.kernels.aot" in cmd) and _alive(int(entry.name)):
                    found.append(f"{entry.name} {cmd[:100]}")
            except OSError:
                pass
        return found

    proc = subprocess.Popen([sys.executable, "-m", "wide_export", "build", "--build-dir", str(build),
                             "--cuda-arch", "80"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "WIDE_PROGRESS_DELAY": "0"}, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        lines = []
        for line in proc.stderr:
            lines.append(line.strip())
            if line.startswith("build: aot"):
                break
        assert lines[:3] == ["build: configure (cmake)", "build: build (cmake)", "build: aot: Triton kernels"], lines
        deadline = time.monotonic() + 60
        while len(of_the_build()) < 3 and time.monotonic() < deadline:  # the CLI, cmake, ninja (and the AOT)
            time.sleep(0.1)
        assert len(of_the_build()) >= 3, of_the_build()
        os.killpg(proc.pid, signal.SIGINT)
        rest = proc.stderr.read()
        assert proc.wait(120) == 130, rest
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert rest.strip().splitlines()[-1] == (f"interrupted (SIGINT); stopped the build and its compilers; "
                                             f"removed {build.resolve()}"), rest
    assert "Traceback" not in rest
    time.sleep(0.5)
    assert of_the_build() == []
    assert not build.exists()
