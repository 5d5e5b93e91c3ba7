"""llama.cpp's rows in `bench vllm` (CPU) and `bench e2e --device cpu`: the table's WIDE / llama.cpp ratios
against a hand computation, the rows' metrics against their own timings, the e2e GGUF's layers against the
timed stack's shapes, and one line (no rows) where llama-cpp-python is missing.

The `llamacpp`-marked tests run where llama-cpp-python is installed (scripts/test-llamacpp.sh); the others
run everywhere (llama.cpp hidden by monkeypatch where it is installed)."""

from __future__ import annotations

import importlib.util
import json

import pytest


def _hide_llamacpp(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llama_cpp" else real(name, *a))


def _bench(with_llama: bool = True):
    from wide_export.bench.vllm import Bench

    def row(side, batch, decode, prefill):
        return {"side": side, "batch": batch, "prompt_len": 128, "new": 32, "ttft_s": batch * 128 / prefill,
                "itl_s": batch / decode, "prefill_tok_s": prefill, "decode_tok_s": decode}

    rows = [row("wide", 1, 20.0, 100.0), row("dense", 1, 10.0, 90.0), row("wide", 4, 60.0, 110.0),
            row("dense", 4, 40.0, 100.0)]
    if with_llama:
        rows += [row("llama.cpp f32", 1, 16.0, 150.0), row("llama.cpp f32", 4, 48.0, 160.0)]
    nbytes = {"wide": 800_000_000, "dense": 1_600_000_000, **({"llama.cpp f32": 1_600_000_000} if with_llama else {})}
    return Bench("CPU: test", "cpu", "float32", rows, True, {}, {"ffn": 0.5}, nbytes, {}, 25.0)


def test_bench_vllm_table_puts_llamacpp_beside_wide_and_dense(tmp_path):
    from rich.console import Console

    from wide_export.bench.vllm import table, write_outputs

    bench = _bench()
    console = Console(width=250, record=True)
    console.print(table(bench))
    text = console.export_text()
    assert "llama.cpp f32" in text and "WIDE / llama.cpp f32" in text
    cells = [[w for w in line.split() if w != "│"] for line in text.splitlines()]
    decode = {c[0]: c for c in cells if "decode" in c and "(tok/s)" in c}
    # batch 1: WIDE 20, dense 10, llama.cpp 16 -> 2.00x and 1.25x; batch 4: 60 / 40 / 48 -> 1.50x and 1.25x
    assert decode["1"][-5:] == ["20.0", "10.0", "2.00x", "16.0", "1.25x"]
    assert decode["4"][-5:] == ["60.0", "40.0", "1.50x", "48.0", "1.25x"]
    gbs = next(c for c in cells if "GB/s" in c and "decode" in c)
    # batch-1 GB/s: WIDE 0.8 GB x 20 = 16.0, dense 1.6 x 10 = 16.0, llama.cpp 1.6 x 16 = 25.6; WIDE / it 0.62x
    assert gbs[-5:] == ["16.0", "16.0", "1.00x", "25.6", "0.62x"]
    data = json.loads(write_outputs(bench, tmp_path)[0].read_text())
    assert data["ratios_llamacpp"]["llama.cpp f32"]["4"]["prefill_tok_s"] == pytest.approx(110 / 160)
    assert data["decode_gbs"]["llama.cpp f32"] == pytest.approx(25.6)


def test_bench_vllm_table_without_llamacpp_rows_is_the_two_engines():
    from rich.console import Console

    from wide_export.bench.vllm import table

    console = Console(width=250, record=True)
    console.print(table(_bench(with_llama=False)))
    assert "llama.cpp" not in console.export_text()


def test_without_llamacpp_bench_vllm_and_e2e_get_one_line_and_no_rows(monkeypatch, tmp_path):
    from wide_export.bench.e2e import PRESETS
    from wide_export.bench.e2e_llamacpp import time_llamacpp
    from wide_export.bench.e2e_stack import TINY
    from wide_export.bench.vllm import _llamacpp_rows

    _hide_llamacpp(monkeypatch)
    notes: list = []
    nbytes = {"wide": 1, "dense": 2}
    assert _llamacpp_rows(None, "float32", tmp_path, (1,), 8, 4, nbytes, notes, print) == []
    assert len(notes) == 1 and notes[0].startswith("llama.cpp rows skipped: llama-cpp-python is not installed")
    assert nbytes == {"wide": 1, "dense": 2}
    rows, why = time_llamacpp(TINY, 2, PRESETS["tiny"], "float32", 0)
    assert rows == {} and why == notes[0]
    assert list(tmp_path.iterdir()) == []  # no GGUF written


def test_e2e_llamacpp_checkpoint_has_the_stack_layer_shapes(tmp_path):
    """The layers llama.cpp runs have the shapes of the layers bench e2e times (the stack's own tensors)."""
    import torch
    from safetensors import safe_open

    from wide_export.bench.e2e_llamacpp import VOCAB, spec_for
    from wide_export.bench.e2e_stack import TINY, random_stack
    from wide_export.model.synthetic import write_checkpoint

    stack = random_stack(TINY, 2, torch.float32, torch.device("cpu"), torch.Generator().manual_seed(0))
    ckpt = write_checkpoint(tmp_path / "ck", spec_for(TINY, 2, 64, 0))
    with safe_open(str(ckpt / "model.safetensors"), "pt") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    for i, layer in enumerate(stack):
        p = f"model.layers.{i}."
        k, v = shapes[p + "self_attn.k_proj.weight"], shapes[p + "self_attn.v_proj.weight"]
        assert (k[0] + v[0], k[1]) == tuple(layer.wkv.shape)
        for name, ours in (("self_attn.q_proj", layer.wq), ("self_attn.o_proj", layer.wo),
                           ("mlp.gate_proj", layer.wg), ("mlp.up_proj", layer.wu), ("mlp.down_proj", layer.wd)):
            assert shapes[p + name + ".weight"] == tuple(ours.shape), name
    assert "model.layers.2.self_attn.q_proj.weight" not in shapes
    assert shapes["model.embed_tokens.weight"] == (VOCAB, TINY.hidden)


@pytest.mark.llamacpp
@pytest.mark.parametrize("dtype,sides", [("float32", ["llama.cpp f32"]),
                                         ("bfloat16", ["llama.cpp bf16", "llama.cpp f16"])])
def test_bench_vllm_llamacpp_rows_are_their_own_timings(tmp_path, dtype, sides):
    from wide_export.bench.common import MODEL_PRESETS
    from wide_export.checkpoint import load_wide_model
    from wide_export.model.synthetic import write_checkpoint
    from wide_export.bench.vllm import _llamacpp_rows

    ckpt = write_checkpoint(tmp_path / "ck", MODEL_PRESETS["tiny"])
    loaded = load_wide_model(ckpt, dtype=dtype, lazy=True, checksums=False)
    nbytes, notes = {"wide": 1, "dense": 2}, []
    rows = _llamacpp_rows(loaded, dtype, tmp_path, (1, 3), 8, 4, nbytes, notes, lambda _m: None)
    assert notes == [] and [(r["side"], r["batch"]) for r in rows] == [(s, b) for s in sides for b in (1, 3)]
    for r in rows:
        assert r["prefill_tok_s"] == pytest.approx(r["batch"] * 8 / r["ttft_s"])
        assert r["decode_tok_s"] == pytest.approx(r["batch"] / r["itl_s"]) and r["itl_s"] > 0
    assert all(nbytes[s] == 2 for s in sides)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]  # the GGUFs are deleted


@pytest.mark.llamacpp
def test_bench_e2e_on_cpu_has_a_llamacpp_row_for_every_case(tmp_path):
    from wide_export.bench.e2e import run_e2e_bench, table

    report = run_e2e_bench(preset="tiny", sparsities=(0.5,), dtype="fp32", device="cpu")
    assert report.notes == [] and list(report.llamacpp) == ["llama.cpp f32"]
    keys = {f"{c.phase} {c.tokens if c.phase == 'prefill' else f'b={c.tokens}'}" for c in report.cases}
    got = report.llamacpp["llama.cpp f32"]
    assert set(got) == keys and all(v > 0 for v in got.values())
    from rich.console import Console

    console = Console(width=250, record=True)
    console.print(table(report))
    c = next(c for c in report.cases if c.phase == "decode" and c.tokens == 1)
    line = next(ln for ln in console.export_text().splitlines() if "decode b=1" in ln)
    assert line.split()[-1] == f"{c.wide_tokens_per_s / got['decode b=1']:.2f}x"


def test_bench_vllm_llamacpp_row_metrics_by_hand(monkeypatch, tmp_path):
    """A llama.cpp run of known times (prefill 2 s, 3 decode steps in 3 s) gives TTFT 2 s, ITL 1 s, decode
    batch tok/s, prefill batch x 8 / 2 tok/s; one GGUF per type of the dtype, each written and deleted."""
    from wide_export.bench import llamacpp
    from wide_export.bench.common import MODEL_PRESETS
    from wide_export.bench.vllm import _llamacpp_rows
    from wide_export.checkpoint import load_wide_model
    from wide_export.model.synthetic import write_checkpoint

    seen = []

    def fake(gguf, prompts, new, n_threads):
        seen.append((gguf.name, gguf.is_file(), len(prompts), len(prompts[0]), new))
        b = len(prompts)
        return llamacpp.LlamaCppRun(batch=b, prompt_tokens=8, decode_steps=3, threads=n_threads, prefill_s=2.0,
                                    decode_s=3.0, prefill_tok_s=b * 8 / 2.0, decode_tok_s=b * 3 / 3.0)

    monkeypatch.setattr(llamacpp, "unavailable_reason", lambda: None)
    monkeypatch.setattr(llamacpp, "run_llamacpp", fake)
    loaded = load_wide_model(write_checkpoint(tmp_path / "ck", MODEL_PRESETS["tiny"]), dtype="bfloat16", lazy=True,
                             checksums=False)
    nbytes, notes = {"wide": 1, "dense": 2}, []
    rows = _llamacpp_rows(loaded, "bfloat16", tmp_path, (1, 3), 8, 4, nbytes, notes, lambda _m: None)
    assert seen == [(f"model-{k}.gguf", True, b, 8, 4) for k in ("bf16", "f16") for b in (1, 3)]
    assert [(r["side"], r["batch"], r["ttft_s"], r["itl_s"], r["decode_tok_s"], r["prefill_tok_s"]) for r in rows] == [
        (s, b, 2.0, 1.0, b, b * 4.0) for s in ("llama.cpp bf16", "llama.cpp f16") for b in (1, 3)]
    assert nbytes == {"wide": 1, "dense": 2, "llama.cpp bf16": 2, "llama.cpp f16": 2} and notes == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]
