"""`wide-export build` and `wide-export bench kernels` through the real CLI (no GPU here)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from wide_export.native import build as native_build


@pytest.fixture()
def cli():
    from wide_export.cli import app

    return app


def test_build_without_nvcc_is_one_clear_error(cli, monkeypatch, tmp_path):
    monkeypatch.setattr(native_build, "find_nvcc", lambda: None)
    res = CliRunner().invoke(cli, ["build", "--build-dir", str(tmp_path / "b")])
    assert res.exit_code == 2
    assert "nvcc" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "b").exists()  # nothing half-written


def test_build_rejects_a_missing_tensorrt_folder(cli, tmp_path):
    res = CliRunner().invoke(cli, ["build", "--build-dir", str(tmp_path / "b"),
                                   "--tensorrt-root", str(tmp_path / "nowhere")])
    assert res.exit_code == 2
    assert "--tensorrt-root" in res.output


def test_build_reports_libraries_and_trt_note(cli, monkeypatch, tmp_path):
    lib = tmp_path / "lib" / "libwide_kernels.so"

    def fake_build(**kw):
        assert kw["cuda_archs"] == "90" and kw["jobs"] == 3
        return native_build.BuildResult(build_dir=tmp_path, libraries=[lib],
                                        trt_note="TensorRT plugins not built (no TensorRT headers found)")

    monkeypatch.setattr(native_build, "build_native", fake_build)
    res = CliRunner().invoke(cli, ["build", "--cuda-arch", "90", "-j", "3"])
    assert res.exit_code == 0, res.output
    assert str(lib) in res.output.replace("\n", "")
    assert "TensorRT plugins not built" in res.output


def test_bench_kernels_needs_a_gpu(cli):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the no-GPU message cannot be checked")
    res = CliRunner().invoke(cli, ["bench", "kernels", "--preset", "short"])
    assert res.exit_code == 2
    assert "needs a CUDA GPU" in res.output and "Traceback" not in res.output


def test_bench_helpers_on_cpu():
    import torch

    from wide_export.bench.kernels import PRESETS, Report, Row, make_mask, target_checks

    g = torch.Generator().manual_seed(0)
    m = make_mask(4000, 32, 0.5, "random", g, "cpu")
    assert m.dtype == torch.int32 and abs(m.float().mean().item() - 0.5) < 0.02
    c = make_mask(4000, 32, 0.7, "correlated", g, "cpu")
    assert abs(c.float().mean().item() - 0.3) < 0.2
    assert set(PRESETS) == {"short", "full"}
    rep = Report(device="x", dtype="fp16", preset="short", copy_bandwidth_gbs=1000.0, rows=[
        Row("n", "q_o", 4096, 4096, 32, 0.5, "random", 1, 1.0, 0.5, 2.0, 0.5, 900.0, 90.0),
        Row("k", "down", 4096, 14336, 32, 0.5, "random", 4096, 1.0, 1.25, 0.8, 1.0),
    ])
    checks = {name: ok for name, ok, _ in target_checks(rep)}
    assert checks["decode (1-4 tokens) >= 1.8x"] is True
    assert checks["never below 0.95x"] is False
    assert checks["K-pruned at G = 32 >= 1.0x"] is False
