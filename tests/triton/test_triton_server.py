"""A real tritonserver on 127.0.0.1 serving the default demo model's onnxruntime
repository: tokens equal the PyTorch reference's greedy output exactly, over HTTP
and gRPC, batched and from 8 concurrent clients; malformed requests get a clear
error and the server keeps answering. Every loop is bounded in count and time.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from tests.triton.support import model_statistics, run_concurrently, wait_until
from wide_export.tritonserver.client import GenerationClient

MODEL = "wide_llm"
DEADLINE_S = 60.0  # per concurrent-client thread


@pytest.fixture(scope="module")
def limits(demo_repo):
    import json

    settings = json.loads((demo_repo / MODEL / "1" / "generation.json").read_text())
    return settings["vocab_size"], settings["max_total_tokens"]


def _prompt(rng, vocab: int, low: int = 1, high: int = 24) -> np.ndarray:
    return rng.integers(0, vocab, size=int(rng.integers(low, high)), dtype=np.int64)


def test_server_listens_on_loopback_only(demo_server):
    import re

    started = re.findall(r"Started (\w+) at ([\d.]+):(\d+)", demo_server.log_text())
    assert {name for name, _, _ in started} == {"GRPCInferenceService", "HTTPService"}  # metrics off
    assert all(address == "127.0.0.1" for _, address, _ in started), started


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_greedy_tokens_equal_the_reference(demo_server, reference, limits, protocol, rng):
    url = getattr(demo_server.endpoints, protocol)
    with GenerationClient(url, protocol, MODEL) as client:
        assert client.is_ready()
        for _ in range(3):
            prompt, n = _prompt(rng, limits[0]), int(rng.integers(1, 12))
            got, expected = client.generate(prompt, n), reference(prompt, n)
            assert got.dtype == np.int64 and got.shape == expected.shape  # n tokens, or fewer ending at eos
            np.testing.assert_array_equal(got, expected)


def test_batched_request_rows_equal_the_reference(demo_server, reference, limits, rng):
    prompts = rng.integers(0, limits[0], size=(3, 9), dtype=np.int64)
    with GenerationClient(demo_server.endpoints.grpc, "grpc", MODEL) as client:
        got = client.generate(prompts, 6)
    expected = [reference(prompt, 6) for prompt in prompts]
    assert got.shape == (3, max(len(e) for e in expected))  # as long as the longest row
    for row, want in zip(got, expected):  # a row that stopped at eos is padded with the pad id (= eos here)
        np.testing.assert_array_equal(row, np.pad(want, (0, got.shape[1] - len(want)), constant_values=reference.eos))


def test_eight_concurrent_clients_all_exact_none_lost(demo_server, reference, limits, rng):
    clients, per_client = 8, 3
    jobs = [[(_prompt(rng, limits[0]), int(rng.integers(1, 10))) for _ in range(per_client)] for _ in range(clients)]
    results: dict[tuple[int, int], np.ndarray] = {}

    def run(c: int) -> None:
        protocol = "http" if c % 2 else "grpc"
        deadline = time.monotonic() + DEADLINE_S
        with GenerationClient(getattr(demo_server.endpoints, protocol), protocol, MODEL, timeout=DEADLINE_S) as cl:
            for i, (prompt, n) in enumerate(jobs[c]):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"client {c} ran past {DEADLINE_S} s")
                results[(c, i)] = cl.generate(prompt, n)

    before = _settled_counts(demo_server)
    run_concurrently([lambda c=c: run(c) for c in range(clients)], DEADLINE_S + 10)
    assert len(results) == clients * per_client
    # the wait ends as soon as every request is counted: generous for a loaded machine, free when on time
    after = _counts(demo_server, before[0] + clients * per_client, wait_s=30.0)
    inferences, executions = (a - b for a, b in zip(after, before))
    assert inferences == clients * per_client  # the server saw every request once
    assert executions < inferences  # dynamic batching merged concurrent requests
    for (c, i), got in results.items():
        prompt, n = jobs[c][i]
        np.testing.assert_array_equal(got, reference(prompt, n))


def _settled_counts(server, quiet_s: float = 2.0, wait_s: float = 30.0) -> tuple[int, int]:
    """_counts once no earlier request is still to be counted: the statistics of a batch whose answer
    a client already holds are recorded a moment later (see _counts), so the earlier tests' last batch
    may be missing from a first read. With no request in flight, wait until the counts stay the same
    for `quiet_s` (bounded by `wait_s`). Generous on purpose: the recording follows the last response
    by milliseconds when the machine is idle; a loaded CI machine stretches that, and a longer quiet
    window costs only its own length."""
    last, quiet_since = _counts(server), time.monotonic()
    deadline = quiet_since + wait_s
    while time.monotonic() - quiet_since < quiet_s and time.monotonic() < deadline:
        time.sleep(0.1)
        now = _counts(server)
        if now != last:
            last, quiet_since = now, time.monotonic()
    return last


def _counts(server, at_least: int = 0, wait_s: float = 5.0) -> tuple[int, int]:
    """(inference_count, execution_count) of the generation model, from the server's statistics.

    The Python backend records a batch's statistics after its responses are sent, so a client
    can hold its last answer a moment before the count includes it: wait (bounded) until
    inference_count reaches `at_least`, then also return whatever it is (an extra count fails
    the caller's equality as well as a missing one).
    """
    stats: dict = {}

    def reached() -> bool:
        stats.update(model_statistics(server, MODEL))
        return int(stats["inference_count"]) >= at_least

    wait_until(reached, wait_s)
    return int(stats["inference_count"]), int(stats["execution_count"])


def _malformed(vocab: int, max_total: int, rng) -> dict:
    ok = rng.integers(0, vocab, size=(1, 5), dtype=np.int64)
    new = np.array([[3]], np.int32)
    return {
        "wrong dtype": ({"input_ids": (ok.astype(np.int32), "INT32"), "max_new_tokens": (new, "INT32")},
                        "INT32|data.type|datatype"),
        "empty prompt": ({"input_ids": (np.zeros((1, 0), np.int64), "INT64"), "max_new_tokens": (new, "INT32")},
                         "empty"),
        "too long": ({"input_ids": (rng.integers(0, vocab, size=(1, max_total), dtype=np.int64), "INT64"),
                      "max_new_tokens": (new, "INT32")}, "exceeds"),
        "zero new tokens": ({"input_ids": (ok, "INT64"), "max_new_tokens": (np.array([[0]], np.int32), "INT32")},
                            "max_new_tokens must be >= 1"),
        "negative new tokens": ({"input_ids": (ok, "INT64"), "max_new_tokens": (np.array([[-4]], np.int32), "INT32")},
                                "max_new_tokens must be >= 1"),
        "token out of vocab": ({"input_ids": (ok + vocab, "INT64"), "max_new_tokens": (new, "INT32")}, "must lie in"),
        "no prompt": ({"max_new_tokens": (new, "INT32")}, "exactly one of input_ids"),
        "two prompts": ({"input_ids": (ok, "INT64"), "text_input": (np.array([[b"hi"]], object), "BYTES")},
                        "exactly one of input_ids"),
        "negative seed": ({"input_ids": (ok, "INT64"), "seed": (np.array([[-1]], np.int64), "INT64")}, "seed"),
        "bad top_p": ({"input_ids": (ok, "INT64"), "max_new_tokens": (new, "INT32"),
                       "top_p": (np.array([[2.0]], np.float32), "FP32")}, "top_p"),
    }


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_malformed_requests_get_clear_errors_and_the_server_keeps_answering(
        demo_server, reference, limits, protocol, rng):
    from tritonclient.utils import InferenceServerException

    url = getattr(demo_server.endpoints, protocol)
    with GenerationClient(url, protocol, MODEL) as client:
        for case, (inputs, message) in _malformed(*limits, rng).items():
            with pytest.raises(InferenceServerException, match=message) as err:
                client.raw_infer(inputs)
            assert err.value.status() in ("400", "StatusCode.INVALID_ARGUMENT"), (case, err.value.status())
            assert demo_server.process.poll() is None, f"server died after {case}"
            prompt = _prompt(rng, limits[0])
            np.testing.assert_array_equal(client.generate(prompt, 4), reference(prompt, 4))


def test_sampling_over_the_server_is_seeded(demo_server, limits, rng):
    prompt = _prompt(rng, limits[0], 4, 10)
    with GenerationClient(demo_server.endpoints.http, "http", MODEL) as client:
        a = client.generate(prompt, 8, temperature=1.5, top_p=0.9, seed=11)
        b = client.generate(prompt, 8, temperature=1.5, top_p=0.9, seed=11)
        greedy = client.generate(prompt, 8)
        zero = client.generate(prompt, 8, temperature=0.0, seed=5)
    np.testing.assert_array_equal(a, b)
    assert ((a >= 0) & (a < limits[0])).all()
    np.testing.assert_array_equal(zero, greedy)
