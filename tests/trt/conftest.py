"""Fixtures of the TensorRT tests: the plugin library (`demo_onnx` is in tests/conftest.py).

$WIDE_TRT_PLUGIN_LIB names a built
libwide_trt_plugins.so (CI cannot build one: it has no TensorRT headers).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


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
