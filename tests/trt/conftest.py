"""Fixtures of the TensorRT tests: one demo-model ONNX export per session, the plugin library.

$WIDE_TEST_ONNX_DIR reuses an existing `wide-export onnx` folder (the export
costs ~30 s on 2 cores); $WIDE_TRT_PLUGIN_LIB names a built
libwide_trt_plugins.so (CI cannot build one: it has no TensorRT headers).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def demo_onnx(tmp_path_factory) -> Path:
    """The default demo model exported to ONNX (float32) through the real export path."""
    given = os.environ.get("WIDE_TEST_ONNX_DIR")
    if given:
        return Path(given)
    from wide_export.checkpoint import load_wide_model
    from wide_export.export.onnx_export import export_onnx

    out = tmp_path_factory.mktemp("trt-demo") / "onnx"
    export_onnx(load_wide_model(None), out)
    return out


@pytest.fixture(scope="session")
def plugin_lib() -> Path:
    """$WIDE_TRT_PLUGIN_LIB, or skip: the library needs TensorRT headers to build."""
    value = os.environ.get("WIDE_TRT_PLUGIN_LIB")
    if not value:
        pytest.skip("WIDE_TRT_PLUGIN_LIB is not set (build libwide_trt_plugins.so with TensorRT headers, "
                    "see plugins/trt/README.md)")
    path = Path(value)
    assert path.is_file(), f"WIDE_TRT_PLUGIN_LIB={value} does not exist"
    return path
