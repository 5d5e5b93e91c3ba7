"""`wide-export build` and `wide-export bench kernels` through the real CLI (no GPU here)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from wide_export.native import build as native_build
from tests.helpers import assert_one_line_error


@pytest.fixture()
def cli():
    from wide_export.cli import app

    return app


def test_build_without_nvcc_is_one_clear_error(cli, monkeypatch, tmp_path):
    monkeypatch.setattr(native_build, "find_nvcc", lambda: None)
    res = CliRunner().invoke(cli, ["build", "--build-dir", str(tmp_path / "b")])
    assert_one_line_error(res)
    assert "nvcc" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "b").exists()  # nothing half-written


def test_build_rejects_a_missing_tensorrt_folder(cli, tmp_path):
    res = CliRunner().invoke(cli, ["build", "--build-dir", str(tmp_path / "b"),
                                   "--tensorrt-root", str(tmp_path / "nowhere")])
    assert_one_line_error(res)
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


def test_bench_kernels_needs_a_gpu_for_real_presets(cli):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the no-GPU message cannot be checked")
    res = CliRunner().invoke(cli, ["bench", "kernels", "--preset", "short"])
    assert_one_line_error(res)
    assert "needs a CUDA GPU" in res.output and "--preset tiny" in res.output and "Traceback" not in res.output


def test_bench_kernels_tiny_preset_runs_the_kernels_on_cpu(cli, tmp_path):
    """The whole harness on CPU: every algorithm timed and checked against the reference, files written."""
    import json

    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the tiny preset then runs on it")
    res = CliRunner().invoke(cli, ["bench", "kernels", "--preset", "tiny", "--output", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert "timings mean nothing" in res.output
    data = json.loads((tmp_path / "kernels.json").read_text())
    assert {r["kernel"] for r in data["rows"]} == {"n", "gated", "k"}
    from wide_export.bench.kernels import plan_kernel_bench

    assert len(plan_kernel_bench("tiny")) == len(data["rows"])  # --dry-run lists what the run times
    for r in data["rows"]:
        assert r["max_rel_error"] < 1e-2, r
        assert r["auto_algo"] in r["algo_ms"]
        assert set(r["algo_ms"]) >= ({"gemv"} if r["tokens"] == 1 else {"tile"})
    # Interpreter timings mean nothing: no policy file, no met/missed verdicts, marked in JSON and plot.
    assert not (tmp_path / "policy-interpreter.json").exists()
    assert "missed" not in res.output and "met " not in res.output and "measured auto policy" not in res.output
    assert data["timings_meaningful"] is False and data["targets"] == [] and data["measured_policy"] is None
    assert "Triton interpreter" in data["timings_note"]
    # bf16 by default; the roofline of every case in the JSON and in the printed table, its % marked n/m
    assert data["dtype"] == "bf16" and data["complete"] is True
    assert all(r["bytes_needed"] > 0 and r["flops"] >= 0 and r["roofline_ms"] > 0 for r in data["rows"])
    assert any(r["flops"] > 0 for r in data["rows"])  # (a T = 1 mask may skip every group: 0 FLOPs)
    assert all(r["pct_of_roofline"] is None for r in data["rows"])
    flat = " ".join(res.output.split())
    assert "roofline at H200 reference figures (4.3 TB/s copy, 790 TFLOP/s bf16)" in flat
    assert "% of limit" in flat and "n/m, CPU interpreter timings mean nothing" in flat
    assert flat.count(" n/m ") >= len(data["rows"])  # one per case


def test_bench_kernels_dry_run_plans_the_short_preset_without_cuda(cli, monkeypatch):
    """scripts/gpu-check.sh --dry-run: the preset parsed, the kernels imported, no CUDA call. The
    short preset by hand: 6 token counts x 4 Llama-3.1-8B shapes x group sizes 32/128/512 (each divides 4096
    and 14336) x one sparsity x one mask."""
    import torch

    def no_cuda(*_a, **_k):
        raise AssertionError("a dry run touched CUDA")

    monkeypatch.setattr(torch.cuda, "is_available", no_cuda)
    monkeypatch.setattr(torch.cuda, "get_device_name", no_cuda)
    res = CliRunner().invoke(cli, ["bench", "kernels", "--preset", "short", "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "would time 72 cases" in res.output and "nothing run" in res.output
    assert "n llama-3.1-8b/q T=1 gs=32" in res.output and "k llama-3.1-8b/down T=16384 gs=512" in res.output
    line = assert_one_line_error(CliRunner().invoke(cli, ["bench", "kernels", "--preset", "huge", "--dry-run"]))
    assert "unknown preset 'huge'" in line
    line = assert_one_line_error(CliRunner().invoke(cli, ["bench", "kernels", "--dtype", "fp8", "--dry-run"]))
    assert "unknown dtype 'fp8'" in line


def test_bench_json_is_written_case_by_case(tmp_path):
    """A run stopped after two cases (a stage timeout) leaves those two in kernels.json, marked incomplete."""
    import json

    import torch

    from wide_export.bench.kernels import run_kernel_bench, write_json

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the tiny preset then runs on it")
    path = tmp_path / "kernels.json"

    def on_row(rep):
        write_json(rep, path)
        if len(rep.rows) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_kernel_bench(preset="tiny", on_row=on_row)
    data = json.loads(path.read_text())
    assert len(data["rows"]) == 2 and data["complete"] is False
    assert data["measured_policy"] is None and data["targets"] == []


def test_the_interpreter_plot_says_its_timings_mean_nothing(monkeypatch, tmp_path):
    import matplotlib.figure

    from wide_export.bench.kernels import Report, write_plot

    saved = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda fig, *a, **k: saved.append(fig))
    write_plot(Report("cpu (Triton interpreter)", "interpreter", "fp16", "tiny", 1.0, [_row("n", 1, 0.01)]),
               tmp_path / "k.png")
    fig = saved[0]
    texts = [fig._suptitle.get_text()] + [t.get_text() for ax in fig.axes for t in ax.texts]
    assert any("timings mean nothing" in t for t in texts)
    assert all("cuBLAS" not in ax.get_ylabel() and "meaningless" in ax.get_ylabel() for ax in fig.axes)


def _row(kernel, tokens, speedup, gs=128, bw=None, err=1e-3, algo_ms=None, auto="gemv"):
    from wide_export.bench.kernels import Row

    return Row(kernel, "m/x", 4096, 4096, gs, 0.5, "random", tokens, 1.0, algo_ms or {auto: 1.0 / speedup}, auto,
               1.0 / speedup, speedup, 0.5, err, None if bw is None else bw * 10, bw)


def test_bench_targets_judge_the_rows():
    import torch

    from wide_export.bench.kernels import Report, make_mask, target_checks

    g = torch.Generator().manual_seed(0)
    m = make_mask(4000, 32, 0.5, "random", g, "cpu")
    assert m.dtype == torch.int32 and abs(m.float().mean().item() - 0.5) < 0.02
    c = make_mask(4000, 32, 0.7, "correlated", g, "cpu")
    assert abs(c.float().mean().item() - 0.3) < 0.2
    rep = Report(device="x", arch="sm_90", dtype="fp16", preset="short", copy_bandwidth_gbs=1000.0, rows=[
        _row("n", 1, 2.0, bw=90.0), _row("k", 4096, 0.9, auto="dense"), _row("gated", 4096, 1.6, auto="grouped"),
    ])
    checks = {name: ok for name, ok, _ in target_checks(rep)}
    assert checks["T=1 >= 1.8x"] is True
    assert checks["T=1 >= 85% of copy bandwidth on active bytes"] is True
    assert checks["never below 0.95x"] is False
    assert checks["gemm_k >= 1.0x"] is False
    assert checks[">= 1.5x at >= 4k tokens, gemm_n/gated, group size >= 128"] is True
    rep.rows.append(_row("gated", 8192, 1.2, auto="grouped"))
    assert dict((n, ok) for n, ok, _ in target_checks(rep))[">= 1.5x at >= 4k tokens, gemm_n/gated, group size >= 128"] is False


def test_measured_policy_reads_the_crossovers():
    from wide_export.bench.kernels import Report, measured_policy

    rows = []
    for T in (1, 2, 4, 16, 256, 4096):
        gemv = 0.5 if T <= 2 else 2.0          # gemv beats dense (1.0 ms) up to T = 2
        grouped = 0.6 if T >= 256 else 1.5      # grouped beats dense from T = 256
        rows.append(_row("n", T, 1.0, algo_ms={"gemv": gemv, "grouped": grouped, "dense": 1.0}, auto="dense"))
        gemv_k = 0.5 if T <= 4 else 2.0        # ... and to T = 4 for gemm_k: thresholds are per kind
        rows.append(_row("k", T, 1.0, algo_ms={"gemv": gemv_k, "grouped": 1.2, "dense": 1.0}, auto="dense"))
    pol = measured_policy(Report("x", "sm_90", "fp16", "short", 1.0, rows))["sm_90"]
    from wide_export.kernels.policy import policy_for

    # gated was not timed: it keeps the table's value
    assert pol["gemv_max_m"] == {"n": 2, "k": 4, "gated": policy_for("sm_90")["gemv_max_m"]["gated"]}
    assert (pol["grouped_n_min_m"], pol["grouped_n_min_group_size"]) == (256, 128)
    assert pol["grouped_k_min_m"] > 4096  # never wins: never chosen
    assert pol["measured"] is True


@pytest.mark.parametrize("tokens,groups,sparsity,kind,skipped", [
    (1, 2, 0.5, "random", 1), (1, 12, 0.5, "random", 6), (7, 4, 0.9, "random", 3),  # round(3.6) = 4: one kept
    (5, 4, 0.1, "correlated", 1),  # round(0.4) = 0: one skipped
    (3, 8, 0.0, "random", 0), (3, 8, 1.0, "correlated", 8), (9, 32, 0.25, "correlated", 8),
])
def test_bench_masks_have_exactly_the_labelled_sparsity_per_token(tokens, groups, sparsity, kind, skipped):
    """The tiny preset's `T=1 gs16` row, labelled 0.5, had skipped every group. Counts by hand."""
    import torch

    from wide_export.bench.kernels import make_mask

    for seed in range(5):
        m = make_mask(tokens, groups, sparsity, kind, torch.Generator().manual_seed(seed), "cpu")
        assert m.shape == (tokens, groups) and m.dtype == torch.int32
        assert (m == 0).sum(dim=1).tolist() == [skipped] * tokens


def test_bench_random_masks_skip_different_groups():
    import torch

    from wide_export.bench.kernels import make_mask

    m = make_mask(400, 12, 0.5, "random", torch.Generator().manual_seed(0), "cpu")
    per_group = (m == 0).float().mean(dim=0)
    assert ((per_group > 0.35) & (per_group < 0.65)).all(), per_group  # not the same six groups every time
    c = make_mask(400, 12, 0.5, "correlated", torch.Generator().manual_seed(0), "cpu")
    agree = (c == c[0]).float().mean()
    assert agree > 0.75  # tokens share most decisions


def test_readme_build_figures_match_the_default_build():
    """The README's progress example said 17/272 while the default build compiles 840."""
    import re
    from pathlib import Path

    from wide_export.kernels import aot
    from wide_export.native.build import DEFAULT_CUDA_ARCHS

    def count(archs):
        return sum(len(aot.arch_specs(a)) for a in archs)

    default = [int(a) for a in DEFAULT_CUDA_ARCHS.split(";")]
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    example = re.search(r"`aot: Triton kernels \d+/(\d+)`", readme)
    assert example and int(example.group(1)) == count(default)
    assert f"{count(default)} for the four default" in readme
    assert f"{count([80])} each for sm_80 / sm_86 / sm_89 and {count([90])} for sm_90" in readme
    assert all(count([a]) == count([80]) for a in (86, 89))
    assert f'`--cuda-arch "80;90"` is {count([80, 90])}' in readme
