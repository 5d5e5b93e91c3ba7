"""`bench generate` (bench/generate.py) on the tiny preset: the rows it promises, the bytes each reads, WIDE at
sparsity 0 giving our dense path's tokens; llama.cpp's rows where llama-cpp-python is installed (its own
environment) with our dense path's greedy tokens, else one line saying they are skipped; refusals."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import assert_one_line_error, make_checkpoint


def _run(**kw):
    from wide_export.bench.generate import run_generate_bench

    args = dict(preset="tiny", sparsities=(0.0, 0.5), batches=(1, 2), prompt_lens=(8,), new=4)
    return run_generate_bench(**{**args, **kw})


def _rows(report, runner):
    return sorted((r for r in report.rows if r.runner == runner), key=lambda r: (r.prompt_len, r.batch))


def test_bench_generate_rows_bytes_and_sparsity_zero_equal_dense():
    from wide_export.bench.common import MODEL_PRESETS

    report = _run(llamacpp=False)
    dense, s0, s50 = _rows(report, "ours dense"), _rows(report, "WIDE s=0.00"), _rows(report, "WIDE s=0.50")
    assert [(r.batch, r.prompt_len) for r in dense] == [(1, 8), (2, 8)] and len(s0) == len(s50) == 2
    assert all(r.decode_tok_s > 0 and r.prefill_tok_s > 0 for r in report.rows)
    assert [r.tokens for r in s0] == [r.tokens for r in dense]  # every group executed: the same model
    spec = MODEL_PRESETS["tiny"]
    h, f, kv = spec.hidden_size, spec.intermediate_size, spec.num_kv_heads * spec.hidden_size // spec.num_heads
    by_hand = 4 * (spec.vocab_size * h + spec.num_layers * (2 * h * h + 2 * kv * h + 3 * f * h))
    assert dense[0].bytes_per_token == by_hand == s0[0].bytes_per_token
    skipped = report.sparsity["WIDE s=0.50"]
    assert abs(skipped["attention"] - 0.5) < 0.15 and abs(skipped["ffn"] - 0.5) < 0.15
    assert s50[0].bytes_per_token < 0.8 * by_hand
    assert report.notes == []


def test_bench_generate_says_in_one_line_when_llamacpp_is_missing():
    from wide_export.bench.llamacpp import available

    if available():
        pytest.skip("llama-cpp-python is installed here")
    report = _run(sparsities=(0.5,), batches=(1,))
    assert len(report.notes) == 1 and report.notes[0].startswith("llama.cpp rows skipped")
    assert not any(r.runner.startswith("llama.cpp") for r in report.rows)


@pytest.mark.llamacpp
def test_bench_generate_llamacpp_rows_have_our_dense_greedy_tokens():
    from wide_export.bench.generate import same_tokens

    report = _run(sparsities=(0.5,))
    assert _rows(report, "llama.cpp f32") and same_tokens(report) is True


def _cli(*args):
    return subprocess.run([sys.executable, "-c", "from wide_export.cli import main; main()", "bench", "generate",
                           *args], capture_output=True, text=True, timeout=300)


def test_bench_generate_refusals_are_one_line(tmp_path):
    ckpt = make_checkpoint(tmp_path / "ck", num_layers=1)
    assert "--sparsity" in assert_one_line_error(_cli("--model", str(ckpt), "--sparsity", "0.5"))
    assert "float64" in assert_one_line_error(_cli("--preset", "tiny", "--dtype", "float64"))
    assert "unknown --preset" in assert_one_line_error(_cli("--preset", "nope"))
    assert "[0, 1)" in assert_one_line_error(_cli("--preset", "tiny", "--sparsity", "1.0"))
