"""Find, hash and load the `wide` plugin library (plugins/trt, libwide_trt_plugins.so).

The library is loaded through `IPluginRegistry.loadLibrary` (its exported
`getCreators` / `setLoggerFinder`), the one way that works in both TensorRT
flavours. Never also dlopen it yourself (ctypes, Polygraphy `--plugins`) in the
same process: plugins/trt/README.md, "Loading the plugin library".
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from wide_export.base.checksum import sha256_of
from wide_export.base.errors import WideError
from wide_export.ops.spec import OPS, PLUGIN_NAMESPACE, PLUGIN_VERSION
from wide_export.trt.backend import Backend

PLUGIN_LIB_ENV = "WIDE_TRT_PLUGIN_LIB"
PLUGIN_LIB_NAME = "libwide_trt_plugins.so"
# The creators the library registers: one per `wide` op (docs/opset.md).
PLUGIN_NAMES = tuple(name for name, spec in OPS.items() if spec.plugin)


@dataclass(frozen=True)
class PluginLibrary:
    """A plugin library loaded into the process's plugin registry."""

    path: Path
    sha256: str
    creators: tuple[str, ...]


def default_plugin_library() -> Optional[Path]:
    """The library named by $WIDE_TRT_PLUGIN_LIB, if set."""
    value = os.environ.get(PLUGIN_LIB_ENV)
    return Path(value) if value else None



_LOADED: dict[str, PluginLibrary] = {}


def load_plugin_library(backend: Backend, path: Path) -> PluginLibrary:
    """Load `path` with IPluginRegistry.loadLibrary once per process; WideError if it fails."""
    path = Path(path).resolve()
    if str(path) in _LOADED:
        return _LOADED[str(path)]
    if not path.is_file():
        raise WideError(f"plugin library {path} not found",
                        hint="build it: cmake -S plugins -B build -DTENSORRT_INCLUDE_DIR=... && cmake --build build")
    with open(path, "rb") as handle:
        if handle.read(4) != b"\x7fELF":
            raise WideError(f"plugin library {path} is not a shared library (no ELF header)",
                            hint="point --plugins at the libwide_trt_plugins.so that `wide-export build` made")
    registry = backend.trt.get_plugin_registry()
    if registry.load_library(str(path)) is None:
        raise WideError(
            f"{backend.flavour} {backend.version} failed to load the plugin library {path}",
            hint="check that it was built against this TensorRT major version and that its "
            "dependencies resolve (ldd); see the TensorRT log above",
        )
    found = tuple(n for n in PLUGIN_NAMES if registry.get_creator(n, PLUGIN_VERSION, PLUGIN_NAMESPACE) is not None)
    if not found:
        raise WideError(f"{path} loaded but registered none of {', '.join(PLUGIN_NAMES)}",
                        hint="is this the wide plugin library (plugins/trt)?")
    lib = PluginLibrary(path=path, sha256=sha256_of(path), creators=found)
    _LOADED[str(path)] = lib
    return lib
