"""`wide-export bench serving` with its defaults, end to end on the demo export: the demo
model ends rows at its eos id, so every served request must ask the server to ignore it and get the tokens it
asked for; the run says what it is doing on stderr (one line per stage, piped) and writes its results."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from wide_export.bench.serving import CLIENT_COUNTS, ServingBenchConfig, staggered_plan


def _asked_staggered_tokens(demo_onnx, tmp_path) -> int:
    """New tokens the default staggered plan asks for in all, on the demo model's vocabulary and context."""
    from wide_export.tritonserver import generation_model as gm
    from wide_export.tritonserver.repository import generate_repository

    repo = generate_repository(tmp_path / "repo", onnx=demo_onnx)
    settings = gm.Settings.load(str(repo / "wide_llm" / "1"))
    return sum(n for _, _, n in staggered_plan(ServingBenchConfig(), settings.vocab_size, settings.max_total_tokens))


def test_bench_serving_defaults_run_end_to_end_on_the_demo_export(demo_onnx, tmp_path):
    out = tmp_path / "serving.json"
    done = subprocess.run(
        [sys.executable, "-m", "wide_export", "bench", "serving", "--onnx", str(demo_onnx), "--output", str(out)],
        capture_output=True, text=True, timeout=540, cwd=tmp_path,
        env={**os.environ, "WIDE_PROGRESS_DELAY": "0", "COLUMNS": "200"})  # piped: every stage's line at once
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "error:" not in done.stderr, done.stderr

    d = ServingBenchConfig()  # the defaults, which the command's options repeat
    report = json.loads(out.read_text())
    config = report["config"]
    for name in ("requests", "prompt_len", "new_tokens", "protocol", "rounds", "staggered", "arrival_ms", "seed"):
        assert config[name] == getattr(d, name), name
    assert config["clients"] == list(CLIENT_COUNTS) == [1, 8]

    rows = report["results"]
    assert sorted((r["name"], r["clients"]) for r in rows) == [
        ("direct onnxruntime", 1), ("direct onnxruntime", 8), ("direct onnxruntime, batched", 8),
        (f"triton {d.protocol}", 1), (f"triton {d.protocol}", 8)]
    for r in rows:  # every path generated exactly what it asked for: new_tokens per request
        assert r["requests"] == d.rounds * d.requests * r["clients"], r
        assert r["tokens"] == d.new_tokens * r["requests"], r
        assert r["tokens_per_s"] > 0 and 0 < r["p50_ms"] <= r["p99_ms"]
    asked = _asked_staggered_tokens(demo_onnx, tmp_path)
    assert [r["name"] for r in report["staggered"]] == ["static batching", "inflight batching"]
    for r in report["staggered"]:
        assert r["requests"] == d.staggered and r["tokens"] == asked, r
        assert 0 < r["first_token_p50_ms"] <= r["p50_ms"] <= r["p99_ms"]

    assert f"wrote {out}" in done.stdout and "staggered arrivals" in done.stdout
    progress = [line for line in done.stderr.splitlines() if line.strip()]
    assert progress and all(line.startswith("bench serving: ") for line in progress), done.stderr
    for stage in ("starting tritonserver", "1 client, direct and triton grpc paths",
                  "8 clients, direct and triton grpc paths", "16 staggered streaming requests, static batching",
                  "16 staggered streaming requests, inflight batching"):
        assert any(stage in line for line in progress), (stage, done.stderr)
