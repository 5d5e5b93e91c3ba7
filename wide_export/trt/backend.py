"""Choose and import the TensorRT flavour: datacenter `tensorrt` or `tensorrt_rtx`.

TensorRT-RTX (pip `tensorrt-rtx-cu13`) needs two things the wheel does not do by
itself before a plugin library can be used (plugins/trt/README.md, "TensorRT-RTX"):
  * its core library loaded RTLD_GLOBAL, so the plugin library's undefined
    `getPluginRegistry` resolves;
  * a `libtensorrt_rtx.so` (unversioned) name on LD_LIBRARY_PATH, which its
    ONNX parser dlopens when it meets a plugin node. glibc reads
    LD_LIBRARY_PATH once at process start, so the work runs in a child process
    whose environment points at a temporary folder holding that symlink
    (site-packages is never modified).
"""

from __future__ import annotations

import atexit
import ctypes
import importlib
import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Optional

from wide_export.base.errors import WideError

BACKENDS = ("tensorrt", "tensorrt_rtx")
FLAVOURS = {"tensorrt": "TensorRT", "tensorrt_rtx": "TensorRT-RTX"}
# The spellings README.md documents for --backend.
_ALIASES: dict[str, Optional[str]] = {"auto": None, "tensorrt-rtx": "tensorrt_rtx"}
_RTX_CORE = "libtensorrt_rtx.so.1"
_RTX_UNVERSIONED = "libtensorrt_rtx.so"


@dataclass(frozen=True)
class Backend:
    """An imported TensorRT flavour."""

    package: str  # "tensorrt" or "tensorrt_rtx"
    trt: ModuleType

    @property
    def flavour(self) -> str:
        return FLAVOURS[self.package]

    @property
    def version(self) -> str:
        return str(self.trt.__version__)

    @property
    def is_rtx(self) -> bool:
        return self.package == "tensorrt_rtx"

    @property
    def major(self) -> int:
        return int(self.version.split(".")[0])


def rtx_lib_dir() -> Optional[Path]:
    """Folder of the TensorRT-RTX shared libraries from the pip wheel, if installed."""
    spec = importlib.util.find_spec("tensorrt_rtx_libs")
    if spec is None or spec.origin is None:
        return None
    folder = Path(spec.origin).parent
    return folder if (folder / _RTX_CORE).is_file() else None


def _import(package: str) -> ModuleType:
    if package == "tensorrt_rtx":
        libs = rtx_lib_dir()
        if libs is not None:
            ctypes.CDLL(str(libs / _RTX_CORE), mode=ctypes.RTLD_GLOBAL)
    return importlib.import_module(package)


def select_backend(requested: Optional[str] = None) -> Backend:
    """Import the requested backend, or the first of BACKENDS that imports ("auto" or None)."""
    requested = _ALIASES.get(requested, requested) if requested is not None else None
    if requested is not None and requested not in BACKENDS:
        raise WideError(f"unknown TensorRT backend {requested!r}", hint=f"use auto or one of {', '.join(BACKENDS)}")
    errors = []
    for package in [requested] if requested else BACKENDS:
        if importlib.util.find_spec(package) is None:
            errors.append(f"{package}: not installed")
            continue
        try:
            return Backend(package, _import(package))
        except (ImportError, OSError) as err:  # e.g. bindings without their libraries
            errors.append(f"{package}: {err}")
    raise WideError(
        "no usable TensorRT: " + "; ".join(errors),
        hint="install tensorrt-rtx-cu13 (the `rtx` extra of wide-export) or NVIDIA TensorRT",
    )


def has_gpu() -> bool:
    """Is an NVIDIA GPU visible to the driver? (No CUDA call: cheap and safe on CPU-only hosts.)"""
    return any(Path("/proc/driver/nvidia/gpus").glob("*"))


def rtx_env_ready() -> bool:
    """Does this process's LD_LIBRARY_PATH (fixed at start) already expose libtensorrt_rtx.so?"""
    for folder in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep):
        if folder and (Path(folder) / _RTX_UNVERSIONED).exists():
            return True
    return False


_ENV_DIR: Optional[Path] = None


def rtx_child_env() -> dict[str, str]:
    """Environment for a child process in which the RTX parser can load plugins."""
    global _ENV_DIR
    libs = rtx_lib_dir()
    if libs is None:
        raise WideError("tensorrt_rtx_libs is not installed",
                        hint="install tensorrt-rtx-cu13 (the `rtx` extra of wide-export)")
    if _ENV_DIR is None:
        _ENV_DIR = Path(tempfile.mkdtemp(prefix="wide-trt-rtx-"))
        atexit.register(shutil.rmtree, _ENV_DIR, True)
        (_ENV_DIR / _RTX_UNVERSIONED).symlink_to(libs / _RTX_CORE)
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(_ENV_DIR), env.get("LD_LIBRARY_PATH", "")) if p)
    return env


def needs_child(requested: Optional[str] = None) -> bool:
    """True when the work must run in a child process with a prepared environment."""
    return select_backend(requested).is_rtx and not rtx_env_ready()
