"""The plugin library's CMake build: skipped with one line without headers, built with them.

TensorRT headers never enter the repository: $WIDE_TRT_INCLUDE points at a
TensorRT `include/` folder (e.g. NVIDIA/TensorRT's public headers, v10.x or
v11.x); without it the header build test is skipped (as in CI).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from wide_export.native.build import SOURCE_DIR, find_cmake, find_nvcc

TEST_ARCH = "80"  # one architecture: this test checks the plugin build, not the kernels


def _configure(build_dir: Path, *defines: str) -> subprocess.CompletedProcess:
    return subprocess.run([find_cmake(), "-S", str(SOURCE_DIR), "-B", str(build_dir),
                           f"-DCMAKE_CUDA_ARCHITECTURES={TEST_ARCH}", *defines],
                          capture_output=True, text=True, check=False)


@pytest.fixture(scope="module")
def needs_nvcc():
    if find_nvcc() is None:
        pytest.skip("nvcc not found: plugins/ (kernels + plugins) cannot be configured here")


def test_without_headers_the_plugin_target_is_skipped_with_one_line(needs_nvcc, tmp_path):
    proc = _configure(tmp_path / "b")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if "wide_trt_plugins" in ln]
    if lines and "headers at" in lines[0]:
        pytest.skip(f"TensorRT headers are installed on this machine: {lines[0]}")
    assert len(lines) == 1 and "TensorRT headers not found, skipping" in lines[0], lines


def test_wrong_explicit_header_path_is_an_error(needs_nvcc, tmp_path):
    proc = _configure(tmp_path / "b", f"-DTENSORRT_INCLUDE_DIR={tmp_path}")
    assert proc.returncode != 0 and "has no NvInferRuntime.h" in proc.stdout + proc.stderr


def test_plugin_library_builds_against_headers(needs_nvcc, tmp_path):
    include = os.environ.get("WIDE_TRT_INCLUDE")
    if not include:
        pytest.skip("WIDE_TRT_INCLUDE is not set (a TensorRT include/ folder; none can be fetched by tests)")
    build = tmp_path / "b"
    proc = _configure(build, f"-DTENSORRT_INCLUDE_DIR={include}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "wide_trt_plugins: TensorRT 1" in proc.stdout
    proc = subprocess.run([find_cmake(), "--build", str(build), "--target", "wide_trt_plugins"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    lib = build / "lib" / "libwide_trt_plugins.so"
    assert lib.is_file()
    if shutil.which("nm"):
        exported = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True).stdout
        symbols = {ln.split()[-1] for ln in exported.splitlines() if " T " in ln}
        # Only the loadLibrary entry points; kernels and cudart stay private.
        assert symbols == {"getCreators", "setLoggerFinder"}, symbols
        undefined = subprocess.run(["nm", "-D", "--undefined-only", str(lib)], capture_output=True, text=True).stdout
        # No link-time TensorRT symbol: getPluginRegistry is looked up when the library loads, so it
        # loads in trtexec, Polygraphy and Triton's TensorRT backend (libnvinfer RTLD_LOCAL) alike.
        assert "getPluginRegistry" not in undefined and "getInferLibVersion" not in undefined
    # ... and a process without any TensorRT can dlopen it (it then registers nothing).
    probe = subprocess.run([sys.executable, "-c", f"import ctypes; ctypes.CDLL({str(lib)!r}); print('ok')"],
                           capture_output=True, text=True, check=False)
    assert probe.stdout.strip() == "ok", probe.stderr
