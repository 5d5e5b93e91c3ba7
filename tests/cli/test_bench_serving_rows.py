"""bench serving's rows that make the table compare like with like: the batched direct
path (the best one ONNX Runtime session does with concurrent requests), ratios against the best direct row,
rounds pooled. Checked against hand-made numbers; the real run is tests/triton/test_triton_cli.py."""

from __future__ import annotations

import pytest

from wide_export.bench.serving import Scenario, add_ratios, merge_rounds, run_batched


def test_a_batched_round_serves_every_clients_request_in_one_call():
    calls = []

    def work(i: int) -> int:
        calls.append(i)
        return 5 * 3  # 5 clients' rows of 3 new tokens

    sc = run_batched(5, 4, work, "direct onnxruntime, batched")
    assert calls == [0, 1, 2, 3]  # one call per round, not one per request
    assert (sc.clients, sc.requests, sc.tokens) == (5, 20, 60)
    assert len(sc.latencies_ms) == 20  # every request of a round waited for the whole call
    assert all(sc.latencies_ms[k] == sc.latencies_ms[k - k % 5] for k in range(20))


def test_ratios_divide_by_the_faster_direct_row_of_the_same_client_count():
    rows = [{"name": "direct onnxruntime", "clients": 1, "tokens_per_s": 100.0},
            {"name": "direct onnxruntime", "clients": 8, "tokens_per_s": 200.0},
            {"name": "direct onnxruntime, batched", "clients": 8, "tokens_per_s": 500.0},
            {"name": "triton grpc", "clients": 1, "tokens_per_s": 90.0},
            {"name": "triton grpc", "clients": 8, "tokens_per_s": 400.0}]
    add_ratios(rows)
    got = {(r["name"], r["clients"]): (r["tokens_per_s_vs_direct"], r["tokens_per_s_vs_best_direct"]) for r in rows}
    assert got[("triton grpc", 1)] == (0.9, 0.9)
    assert got[("triton grpc", 8)] == (2.0, 0.8)  # 2x the one-request-per-call path, 0.8x the batched one
    assert got[("direct onnxruntime", 8)] == (1.0, 0.4)
    assert got[("direct onnxruntime, batched", 8)] == (2.5, 1.0)


def test_rounds_are_pooled_and_each_rounds_rate_is_kept():
    a = Scenario("triton grpc", 2, 4, 40, 2.0, latencies_ms=[1.0, 2.0, 3.0, 4.0])
    b = Scenario("triton grpc", 2, 4, 40, 0.5, latencies_ms=[5.0, 6.0, 7.0, 8.0])
    s = merge_rounds([a, b]).summary()
    assert (s["requests"], s["tokens"], s["wall_s"]) == (8, 80, 2.5)
    assert s["tokens_per_s"] == pytest.approx(32.0)  # 80 tokens over 2.5 s, not the mean of 20 and 80
    assert s["round_tokens_per_s"] == [20.0, 80.0]
    assert s["p50_ms"] == pytest.approx(4.5)
