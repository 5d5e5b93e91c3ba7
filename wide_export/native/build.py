"""Configure and build plugins/ (CUDA kernels, TensorRT plugins) with CMake.

`build_native()` is what `wide-export build` runs: one CMake configure + build
into a build folder (default ``<repo>/build/native``); every library lands in
``<build>/lib``.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

from wide_export.base.errors import WideError

REPO_ROOT = Path(__file__).resolve().parents[2]
SOURCE_DIR = REPO_ROOT / "plugins"
DEFAULT_BUILD_DIR = REPO_ROOT / "build" / "native"
DEFAULT_CUDA_ARCHS = "80;86;89;90"
KERNELS_LIB_NAME = "libwide_kernels.so"


@dataclass
class BuildResult:
    """Where a build went and what it produced."""

    build_dir: Path
    libraries: list[Path] = field(default_factory=list)
    trt_note: Optional[str] = None  # why the TensorRT plugin library is missing, if it is
    log: Optional[Path] = None

    @property
    def lib_dir(self) -> Path:
        return self.build_dir / "lib"


def find_cmake() -> str:
    """cmake from PATH, else the one shipped by the `cmake` PyPI package."""
    exe = shutil.which("cmake")
    if exe:
        return exe
    try:
        import cmake  # type: ignore[import-not-found]

        candidate = Path(cmake.CMAKE_BIN_DIR) / "cmake"
        if candidate.exists():
            return str(candidate)
    except ImportError:
        pass
    raise WideError("cmake was not found", hint="install it (apt install cmake, or pip install cmake)")


def find_nvcc() -> Optional[str]:
    """The CUDA compiler CMake would use: $CUDACXX, nvcc on PATH, /usr/local/cuda/bin/nvcc."""
    env = os.environ.get("CUDACXX")
    if env and Path(env).exists():
        return env
    exe = shutil.which("nvcc")
    if exe:
        return exe
    default = Path("/usr/local/cuda/bin/nvcc")
    return str(default) if default.exists() else None


def normalize_archs(archs: Optional[str]) -> str:
    """'80,90' / '80;90' / 'sm_80 sm_90' -> '80;90' (CMake list)."""
    if not archs:
        return DEFAULT_CUDA_ARCHS
    items = [a.strip().lower().removeprefix("sm_").removeprefix("compute_")
             for a in archs.replace(",", ";").replace(" ", ";").split(";")]
    items = [a for a in items if a]
    for a in items:
        core = a.removesuffix("-real").removesuffix("-virtual").removesuffix("a")
        if not core.isdigit():
            raise WideError(f"bad CUDA architecture {a!r}", hint="use numbers such as 80;86;89;90")
    return ";".join(items)


def configure_command(
    build_dir: Path,
    cuda_archs: Optional[str] = None,
    tensorrt_root: Optional[Path] = None,
    tensorrt_include_dir: Optional[Path] = None,
    tensorrt_lib_dir: Optional[Path] = None,
    nvcc: Optional[str] = None,
) -> list[str]:
    """The `cmake -S plugins -B build_dir ...` command line."""
    cmd = [find_cmake(), "-S", str(SOURCE_DIR), "-B", str(build_dir),
           "-DCMAKE_BUILD_TYPE=Release", f"-DCMAKE_CUDA_ARCHITECTURES={normalize_archs(cuda_archs)}",
           f"-DWIDE_PYTHON={sys.executable}"]  # runs the Triton AOT step (wide_export/kernels/aot.py)
    if shutil.which("ninja") and not (build_dir / "CMakeCache.txt").exists():
        cmd += ["-G", "Ninja"]
    if nvcc:
        cmd.append(f"-DCMAKE_CUDA_COMPILER={nvcc}")
    for name, value in (("TENSORRT_ROOT", tensorrt_root), ("TENSORRT_INCLUDE_DIR", tensorrt_include_dir),
                        ("TENSORRT_LIB_DIR", tensorrt_lib_dir)):
        if value is not None:
            cmd.append(f"-D{name}={Path(value).resolve()}")
    return cmd


def build_native(
    build_dir: Optional[Path] = None,
    cuda_archs: Optional[str] = None,
    tensorrt_root: Optional[Path] = None,
    tensorrt_include_dir: Optional[Path] = None,
    tensorrt_lib_dir: Optional[Path] = None,
    jobs: Optional[int] = None,
    targets: Sequence[str] = (),
    on_step: Optional[Callable[[str], None]] = None,
    on_progress: Optional[Callable[[str, Optional[int], Optional[int]], None]] = None,
) -> BuildResult:
    """Configure and build plugins/; raises WideError (with the log's tail) on failure.

    on_progress(stage, done, total) follows the build's output: configure, the Triton AOT compile
    (`aot: i/N compiled`), nvcc / c++ compiles and links (ninja's or make's counts).
    CMake and everything it starts run in their own process group: an interrupt (KeyboardInterrupt,
    which SIGTERM also raises under the CLI) stops all of it, AOT workers included, then removes the
    build folder when this call created it (an existing one keeps what finished: ninja deletes the
    outputs of the commands it was running, the AOT step writes through temp files, removed here);
    the KeyboardInterrupt is re-raised as signals.Interrupted saying what is left."""
    if not (SOURCE_DIR / "CMakeLists.txt").exists():
        raise WideError(f"no native sources at {SOURCE_DIR}",
                        hint="build from a source checkout of wide-export (plugins/ is not packaged)")
    nvcc = find_nvcc()
    if nvcc is None:
        raise WideError("nvcc (the CUDA compiler) was not found",
                        hint="install the CUDA toolkit and put nvcc on PATH, or set CUDACXX")
    for name, value in (("--tensorrt-root", tensorrt_root), ("--tensorrt-include-dir", tensorrt_include_dir),
                        ("--tensorrt-lib-dir", tensorrt_lib_dir)):
        if value is not None and not Path(value).is_dir():
            raise WideError(f"{name} {value} is not a folder",
                            hint="pass an existing TensorRT folder (the install prefix, or its include/ / lib/)")
    find_cmake()  # before the build folder exists
    build_dir = Path(build_dir or DEFAULT_BUILD_DIR).resolve()
    fresh = not build_dir.exists()
    try:
        build_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise WideError(f"cannot create the build folder {build_dir}: {err.strerror}",
                        hint="pass a writable --build-dir") from None
    try:
        return _build(build_dir, cuda_archs, tensorrt_root, tensorrt_include_dir, tensorrt_lib_dir, nvcc, jobs,
                      targets, on_step, on_progress)
    except KeyboardInterrupt:
        from wide_export.base.signals import Interrupted, shielded

        with shielded():
            if fresh:
                shutil.rmtree(build_dir, ignore_errors=True)
                left = f"stopped the build and its compilers; removed {build_dir}"
            else:
                for tmp in (build_dir / "aot").glob("*.tmp"):
                    tmp.unlink(missing_ok=True)
                left = (f"stopped the build and its compilers; {build_dir} keeps what finished before "
                        "(a rerun continues from there)")
        raise Interrupted(left) from None


def _build(build_dir, cuda_archs, tensorrt_root, tensorrt_include_dir, tensorrt_lib_dir, nvcc, jobs, targets,
           on_step, on_progress) -> BuildResult:
    from wide_export.base.childproc import run_group

    log = build_dir / "build.log"
    steps = [("configure", configure_command(build_dir, cuda_archs, tensorrt_root, tensorrt_include_dir,
                                             tensorrt_lib_dir, nvcc))]
    build_cmd = [find_cmake(), "--build", str(build_dir), "--parallel", str(jobs or os.cpu_count() or 2)]
    for t in targets:
        build_cmd += ["--target", t]
    steps.append(("build", build_cmd))
    with log.open("w") as fh:
        for name, cmd in steps:
            if on_step:
                on_step(name)
            fh.write("$ " + " ".join(cmd) + "\n")
            fh.flush()
            parse = BuildOutput(name, on_progress)
            returncode = run_group(cmd, log=fh, on_line=parse)
            if returncode != 0:
                fh.flush()
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
                raise WideError(f"CMake {name} failed (exit {returncode}); last lines of {log}:\n{tail}",
                                hint="see the full log above")
    libs = sorted(p for p in (build_dir / "lib").glob("*") if p.suffix in (".so", ".a") or ".so." in p.name)
    return BuildResult(build_dir=build_dir, libraries=libs, trt_note=_trt_note(libs, log), log=log)


class BuildOutput:
    """Turns the lines of `cmake` / `cmake --build` into on_progress(stage, done, total) calls."""

    AOT_START = re.compile(r"aot: compiling (\d+) Triton kernel.*\((\d+) process")
    AOT_READY = "aot: compiler process ready"  # = kernels.aot.WORKER_READY (not imported: it pulls in torch)
    AOT_COUNT = re.compile(r"aot: (\d+)/(\d+) compiled")
    NINJA = re.compile(r"^\[(\d+)/(\d+)\] (.*)")
    MAKE = re.compile(r"^\[\s*(\d+)%\] (.*)")

    def __init__(self, step: str, on_progress=None):
        self.step = step
        self.on_progress = on_progress
        if on_progress is not None:
            on_progress("configure (cmake)" if step == "configure" else "build (cmake)", None, None)

    @staticmethod
    def stage_of(action: str) -> Optional[str]:
        if "Triton" in action or "wide_aot" in action or "aot" in action.split("/")[0]:
            return "aot: Triton kernels"
        if "CUDA object" in action:
            return "nvcc"
        if "Linking" in action:
            return "link"
        if "object" in action:
            return "c++"
        return None

    def __call__(self, line: str) -> None:
        if self.on_progress is None:
            return
        if m := self.AOT_START.search(line):
            # the compiler processes start first (imports, ~10-30 s on 2 cores): that moves the bar too
            self._aot_total, self._workers, self._ready = int(m.group(1)), int(m.group(2)), 0
            self.on_progress("aot: starting compiler processes", 0, self._workers)
        elif line.strip() == self.AOT_READY and getattr(self, "_workers", 0):
            self._ready += 1
            self.on_progress("aot: starting compiler processes", min(self._ready, self._workers), self._workers)
            if self._ready == self._workers:
                self.on_progress("aot: Triton kernels", 0, self._aot_total)
        elif m := self.AOT_COUNT.search(line):
            self.on_progress("aot: Triton kernels", int(m.group(1)), int(m.group(2)))
        elif m := self.NINJA.match(line):
            stage = self.stage_of(m.group(3))
            if stage and stage.startswith("aot"):
                self.on_progress(stage, None, None)
            elif stage:
                self.on_progress(stage, int(m.group(1)), int(m.group(2)))
        elif m := self.MAKE.match(line):
            stage = self.stage_of(m.group(2))
            if stage and not stage.startswith("aot"):
                self.on_progress(stage, int(m.group(1)), 100)


def _trt_note(libs: list[Path], log: Path) -> Optional[str]:
    """One line explaining a missing TensorRT plugin library, or None if it was built."""
    if not (SOURCE_DIR / "trt" / "CMakeLists.txt").exists():
        return "TensorRT plugins not built: plugins/trt/ has no CMakeLists.txt"
    if any("wide_kernels" not in p.name and p.suffix == ".so" for p in libs):
        return None
    said = [ln.strip().removeprefix("-- ") for ln in log.read_text(errors="replace").splitlines()
            if "tensorrt" in ln.lower() and ("skip" in ln.lower() or "not found" in ln.lower())]
    return said[0] if said else ("TensorRT plugins not built (no TensorRT headers found; pass "
                                 "--tensorrt-root or --tensorrt-include-dir)")
