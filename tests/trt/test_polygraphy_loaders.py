"""The engine build goes through Polygraphy's loader chain (wide_export/trt/loaders.py):
NetworkFromOnnxPath -> CreateConfig(RTX) with Profiles and the timing cache -> EngineBytesFromNetwork."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from typer.testing import CliRunner

from wide_export.base.errors import WideError

pytestmark = pytest.mark.trt


def test_manifest_names_the_polygraphy_loader_chain(demo_onnx, tmp_path):
    import polygraphy

    from wide_export.cli import app
    from wide_export.trt.backend import select_backend

    out = tmp_path / "e"
    result = CliRunner().invoke(app, ["trt", "--onnx", str(demo_onnx), "--output", str(out), "--max-batch", "2",
                                      "--max-input-len", "8", "--max-seq-len", "16"], env={"WIDE_TRT_PLUGIN_LIB": ""})
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "wide_engine.json").read_text())
    config = "CreateConfigRTX" if select_backend(None).is_rtx else "CreateConfig"
    assert manifest["builder"] == {"polygraphy": polygraphy.__version__,
                                   "loaders": ["NetworkFromOnnxPath", config, "EngineBytesFromNetwork"]}
    assert (out / "timing.cache").stat().st_size > 0  # saved by EngineBytesFromNetwork, written with the engine
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e"]


def test_compute_capability_names_become_polygraphy_pairs():
    trt = pytest.importorskip("tensorrt_rtx")
    from wide_export.trt.loaders import compute_capability_pair

    assert compute_capability_pair(trt, "SM89") == (8, 9)
    assert compute_capability_pair(trt, "SM120") == (12, 0)
    with pytest.raises(WideError, match="unknown compute capability 'SM12'.*SM89"):
        compute_capability_pair(trt, "SM12")


def test_config_carries_our_profiles_and_target():
    """In a child Python: Polygraphy picks its TensorRT flavour once per process."""
    pytest.importorskip("tensorrt_rtx")
    code = textwrap.dedent("""
        import json
        from wide_export.trt import loaders
        from wide_export.trt.backend import select_backend
        from wide_export.trt.profiles import Profile
        be = select_backend("tensorrt_rtx")
        loaders.use_flavour(be)
        ours = [Profile("prefill", {"x": ((1, 1), (2, 4), (4, 8))}), Profile("decode", {"x": ((1, 1), (2, 1), (4, 1))})]
        cfg = loaders.create_config(be, ours, None, "SM89")
        print(json.dumps({"type": type(cfg).__name__, "cc": cfg.compute_capabilities,
                          "profiles": [{k: [list(v.min), list(v.opt), list(v.max)] for k, v in p.items()}
                                       for p in cfg.profiles]}))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["type"] == "CreateConfigRTX" and got["cc"] == [[8, 9]]
    assert got["profiles"] == [{"x": [[1, 1], [2, 4], [4, 8]]}, {"x": [[1, 1], [2, 1], [4, 1]]}]


def test_the_logger_drops_the_int64_binding_reminder_and_keeps_other_warnings(capsys):
    """TensorRT-RTX printed `Make sure input input_ids has Int64 binding` three times per build."""
    import enum
    import types

    from wide_export.trt.loaders import quiet_logger

    class ILogger:
        class Severity(enum.IntEnum):  # ordered and printed as tensorrt's (`Severity.WARNING`)
            INTERNAL_ERROR, ERROR, WARNING, INFO, VERBOSE = range(5)
            __str__ = enum.Enum.__str__

        def __init__(self):
            pass

    logger = quiet_logger(types.SimpleNamespace(ILogger=ILogger))
    w = ILogger.Severity.WARNING
    for name in ("input_ids", "attention_mask", "position_ids"):
        logger.log(w, f"ModelImporter.cpp:1071: Make sure input {name} has Int64 binding.")
    logger.log(w, "onnxOpImporters.cpp: some other warning")
    logger.log(ILogger.Severity.INFO, "an info line")
    assert capsys.readouterr().err.splitlines() == ["[TRT] [W] onnxOpImporters.cpp: some other warning"]
