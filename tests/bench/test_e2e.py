"""`wide-export bench e2e`: the layer stack it times, its router calibration, and the CPU preset end to end.

The oracle is a decoder layer written out by hand here from docs/opset.md: routers
applied in float64, naive causal GQA attention, heads and channels of skipped
groups zeroed. It shares nothing with wide_export.bench.e2e_stack but the weights.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from tests.helpers import assert_one_line_error
from wide_export.bench import e2e_stack as st


def _route(h, router):
    wc, bc, wr, br = (t.double() for t in router)
    logits = (h.double() @ wc.T + bc) @ wr.T + br
    pairs = logits.reshape(*logits.shape[:-1], -1, 2)
    return pairs[..., 0] >= pairs[..., 1]  # [1, T, G] bool, ties execute


def _rms(x, w):
    return w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)


def _rope(x, pos, theta=500000.0):
    """x [T, D]: pairs (i, i + D/2) rotated by pos * theta^(-2i/D)."""
    D = x.shape[-1]
    ang = pos[:, None].double() * theta ** (-torch.arange(0, D, 2).double() / D)
    c, s = ang.cos().float(), ang.sin().float()
    a, b = x[:, :D // 2], x[:, D // 2:]
    return torch.cat([a * c - b * s, b * c + a * s], dim=-1)


def hand_layer(shape, L, h, force_dense=False):
    """One WIDE layer for h [1, T, H] (float32) by hand; returns (h', attention mask, ffn mask)."""
    T, D, hq, hkv = h.shape[1], shape.head_dim, shape.heads, shape.kv_heads
    pos = torch.arange(T)
    ma = _route(h, L.router_attn)
    if force_dense:
        ma = torch.ones_like(ma)
    x = _rms(h, L.ln1)[0]
    q, kv = x @ L.wq.T, x @ L.wkv.T
    k, v = kv[:, :hkv * D], kv[:, hkv * D:]
    o = torch.zeros(T, hq * D)
    causal = torch.ones(T, T).tril().bool()
    for j in range(hq):
        kj = j // (hq // hkv)  # GQA: the kv head of query head j
        qh, kh = _rope(q[:, j * D:(j + 1) * D], pos), _rope(k[:, kj * D:(kj + 1) * D], pos)
        vh = v[:, kj * D:(kj + 1) * D]
        scores = (qh @ kh.T / D**0.5).masked_fill(~causal, float("-inf"))
        head = torch.softmax(scores, -1) @ vh
        o[:, j * D:(j + 1) * D] = head * ma[0, :, j // shape.heads_per_group, None]  # skipped heads are zero
    h = h + (o @ L.wo.T)[None]
    mf = _route(h, L.router_ffn)
    if force_dense:
        mf = torch.ones_like(mf)
    x = _rms(h, L.ln2)[0]
    y = F.silu(x @ L.wg.T) * (x @ L.wu.T)
    y = y * mf[0].repeat_interleave(shape.ffn_group_size, dim=-1)  # skipped channels are zero
    return h + (y @ L.wd.T)[None], ma, mf


@pytest.fixture(scope="module")
def tiny():
    g = torch.Generator().manual_seed(0)
    stack = st.random_stack(st.TINY, 2, torch.float32, torch.device("cpu"), g)
    h = torch.randn(1, 48, st.TINY.hidden, generator=g)
    return stack, h


def test_wide_layer_on_the_kernels_matches_the_hand_written_layer(tiny):
    stack, h = tiny
    shape = st.TINY
    st.calibrate(shape, stack, h, 0.5)
    rotary = st.rope(torch.arange(h.shape[1]), shape.head_dim, h.dtype)
    masks: list = []
    with torch.no_grad():
        got = st.wide_layer(shape, stack[0], h, rotary, st.kernel_ops(), masks=masks)
    want, ma, mf = hand_layer(shape, stack[0], h)
    assert torch.equal(masks[0][0].bool(), ma) and torch.equal(masks[0][1].bool(), mf)
    assert 0.2 < ma.float().mean() < 0.8 and 0.2 < mf.float().mean() < 0.8  # both decisions occur
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_dense_layer_matches_the_hand_written_layer_with_every_group_on(tiny):
    stack, h = tiny
    rotary = st.rope(torch.arange(h.shape[1]), st.TINY.head_dim, h.dtype)
    want, _, _ = hand_layer(st.TINY, stack[1], h, force_dense=True)
    torch.testing.assert_close(st.dense_layer(st.TINY, stack[1], h, rotary), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("sparsity", [0.25, 0.5, 0.75])
def test_calibrated_routers_skip_the_target_fraction_of_each_group(tiny, sparsity):
    stack, h = tiny
    st.calibrate(st.TINY, stack, h, sparsity)
    T = h.shape[1]
    x = h
    for L in stack:  # the calibration tokens as each layer's routers see them (hand-written stack)
        x, ma, mf = hand_layer(st.TINY, L, x)
        for mask in (ma, mf):
            executed = mask[0].double().mean(0)  # per group, over tokens
            assert (executed - (1 - sparsity)).abs().max() <= 1.5 / T, executed


def test_bench_e2e_tiny_preset_runs_on_cpu(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the default preset then runs on it")
    from wide_export.cli import app

    res = CliRunner().invoke(app, ["bench", "e2e", "--preset", "tiny", "--output", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert "timings mean nothing" in res.output and "1.68x" in res.output and "1.55x" in res.output
    data = json.loads((tmp_path / "e2e.json").read_text())
    assert not data["timings_meaningful"]
    cases = {(c["sparsity"], c["phase"], c["tokens"]) for c in data["cases"]}
    assert cases == {(s, p, n) for s in (0.25, 0.5, 0.75) for p, n in
                     [("prefill", 16), ("prefill", 64), ("decode", 1), ("decode", 4)]}
    for c in data["cases"]:
        assert c["dense_ms"] > 0 and c["wide_ms"] > 0 and c["speedup"] == pytest.approx(c["dense_ms"] / c["wide_ms"])
        assert set(c["algos"]) == {"q", "o", "gate_up", "down"}
    for s, check in data["check"].items():
        assert check["mask_agreement"] == 1.0 and check["max_rel_error"] < 1e-2, (s, check)
        for kind, realized in data["realized"][s].items():  # on fresh tokens, not the calibration ones
            assert abs(realized - float(s)) < 0.12, (s, kind, realized)
    assert (tmp_path / "e2e.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_e2e_real_preset_needs_a_gpu(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    from wide_export.cli import app

    line = assert_one_line_error(CliRunner().invoke(app, ["bench", "e2e", "--preset", "llama-3.1-8b",
                                                          "--output", str(tmp_path)]))
    assert "needs a CUDA GPU" in line and "--preset tiny" in line


def test_bench_e2e_rejects_a_sparsity_out_of_range(tmp_path):
    from wide_export.cli import app

    line = assert_one_line_error(CliRunner().invoke(app, ["bench", "e2e", "--preset", "tiny", "--sparsity", "1.5",
                                                          "--output", str(tmp_path)]))
    assert "sparsities must lie in [0, 1)" in line


def test_bench_e2e_dry_run_plans_the_gpu_preset_without_cuda(tmp_path, monkeypatch):
    """scripts/gpu-check.sh --dry-run: gpu-check's e2e command starts (options checked, kernels
    imported) and stops before CUDA: 3 prefill lengths + 2 decode batches at the one sparsity, nothing written."""
    from wide_export.cli import app

    def no_cuda(*_a, **_k):
        raise AssertionError("a dry run touched CUDA")

    monkeypatch.setattr(torch.cuda, "is_available", no_cuda)
    monkeypatch.setattr(torch.cuda, "get_device_name", no_cuda)
    args = ["bench", "e2e", "--preset", "llama-3.1-8b", "--sparsity", "0.5", "--output", str(tmp_path / "o"),
            "--dry-run"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "would time 5 cases, from prefill 512 tokens at 50% to decode batch 4 at 50%" in " ".join(res.output.split())
    assert not (tmp_path / "o").exists()
    line = assert_one_line_error(CliRunner().invoke(app, args + ["--algo", "fastest"]))
    assert "unknown algorithm 'fastest'" in line


@pytest.mark.gpu
def test_bench_e2e_llama_layer_on_the_gpu():
    """One Llama-3.1-8B layer at 50 %: kernels agree with the reference, every case replays as a CUDA graph."""
    from wide_export.bench.e2e import run_e2e_bench

    report = run_e2e_bench("llama-3.1-8b", sparsities=(0.5,), layers=1)
    check = report.check["0.5"]
    assert check["mask_agreement"] >= 0.99 and check["max_rel_error"] <= 2e-2, check
    assert all(c.cuda_graph for c in report.cases), [c.note for c in report.cases]
    assert all(abs(v - 0.5) < 0.05 for v in report.realized["0.5"].values()), report.realized


def test_e2e_algorithm_choice_follows_per_shape_policy_rules(monkeypatch):
    # A per-shape rule for the 8B down projection [4096, 14336] alone: at M = 4 only down is a GEMV; o has the
    # same kind ('k') and group count but another shape, so it keeps the kind's threshold (2).
    from wide_export.bench import e2e
    from wide_export.kernels import launch

    pol = {"measured": True, "gemv_max_m": {"n": 2, "gated": 2, "k": 2}, "gemv_max_m_shapes": {"k:4096x14336": 8},
           "grouped_n_min_m": 1024, "grouped_n_min_group_size": 64, "grouped_k_min_m": 1024,
           "grouped_k_min_group_size": 512, "fallback": "dense", "arch": "sm_90"}
    monkeypatch.setattr(launch, "policy_of", lambda device: pol)
    got = e2e._algos(st.LLAMA_8B, 4, "auto", torch.device("cpu"))
    assert got == {"q": "dense", "o": "dense", "gate_up": "dense", "down": "gemv"}
    assert e2e._algos(st.LLAMA_8B, 2, "auto", torch.device("cpu")) == dict.fromkeys(("q", "o", "gate_up", "down"),
                                                                                     "gemv")
