"""`bench serving --openai`: the TTFT / inter-token / percentile arithmetic on hand-made timestamps, and
one streamed request through the official client against the fake-engine frontend."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.frontend.fakes import MODEL, PIECES, FakeEngine
from wide_export.bench.serving import ServingBenchConfig, StreamTiming, openai_stats, openai_stream, percentile
from wide_export.base.errors import WideError


def test_percentile_is_linear_and_empty_is_none():
    assert percentile([20, 50, 100, 100], 50) == 75
    assert percentile([10], 99) == 10
    assert percentile([0, 100], 99) == pytest.approx(99)
    assert percentile([], 50) is None


def test_ttft_inter_token_and_tokens_per_second():
    timings = [StreamTiming(sent=0.0, token_times=[0.100, 0.150, 0.250], tokens=3),
               StreamTiming(sent=1.0, token_times=[1.300, 1.320, 1.420], tokens=3)]
    row = openai_stats("x", 2, timings, wall_s=2.0)
    assert (row["requests"], row["tokens"], row["tokens_per_s"]) == (2, 6, 3.0)
    # first token: 100 and 300 ms
    assert row["ttft_p50_ms"] == pytest.approx(200) and row["ttft_p99_ms"] == pytest.approx(298)
    # gaps within each request only (not across requests): 50, 100, 20, 100 ms
    assert row["itl_p50_ms"] == pytest.approx(75) and row["itl_p99_ms"] == pytest.approx(100)
    # sent -> last token: 250 and 420 ms
    assert row["p50_ms"] == pytest.approx(335) and row["p99_ms"] == pytest.approx(418.3)


def test_one_token_requests_have_no_inter_token_latency():
    row = openai_stats("x", 1, [StreamTiming(sent=0.0, token_times=[0.5], tokens=1)], wall_s=1.0)
    assert row["ttft_p50_ms"] == pytest.approx(500) and row["itl_p50_ms"] is None


def test_openai_stream_times_each_token_and_asks_for_ignore_eos(live):
    import openai

    engine = FakeEngine(delay=0.01)
    frontend = live(engine)
    client = openai.OpenAI(base_url=frontend.url, api_key="none", max_retries=0)
    timing = openai_stream(client, MODEL, [1, 2, 3], len(PIECES))
    assert timing.tokens == len(PIECES) and len(timing.token_times) == len(PIECES)  # held-back text counts too
    assert timing.sent < timing.token_times[0] and timing.token_times == sorted(timing.token_times)
    req = engine.requests[-1]
    assert (req.ignore_eos, req.prompt_ids, req.max_tokens, req.temperature) == (True, [1, 2, 3], len(PIECES), 0)
    with pytest.raises(WideError, match="5 of 9 tokens"):
        openai_stream(client, MODEL, [1], 9)  # the fake stops at 5: not what was asked


def test_bench_options_are_checked(tmp_path):
    from wide_export.bench.serving import run_serving_bench

    with pytest.raises(WideError, match="--repository is for --openai"):
        run_serving_bench(ServingBenchConfig(repository=tmp_path, output=tmp_path / "x.json"))
    with pytest.raises(WideError, match="--clients"):
        run_serving_bench(ServingBenchConfig(openai=True, clients=(0,), output=Path(tmp_path / "x.json")))
