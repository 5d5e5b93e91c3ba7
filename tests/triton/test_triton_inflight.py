"""In-flight batching on a real tritonserver (127.0.0.1, CPU, onnxruntime flavour, demo
model): 16 staggered clients over HTTP generate_stream and gRPC streams get exactly the
PyTorch reference's greedy tokens; a short request that arrives during a long stream
finishes first; malformed requests and clients that leave mid-stream do not disturb the
others; the server stops cleanly with streams in flight. Every wait is bounded.
"""

from __future__ import annotations

import json
import queue
import re
import threading
import time

import numpy as np
import pytest
from typer.testing import CliRunner

from tests.triton.sse_stream import Stream
from tests.triton.support import requests_done, run_concurrently, serve_until_teardown, wait_until

MODEL = "wide_llm"
DEADLINE_S = 120.0


def _write_repo(onnx, out, *flags):
    from wide_export.cli import app

    result = CliRunner().invoke(app, ["triton", "--onnx", str(onnx), "--output", str(out), *flags])
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def inflight_repo(demo_onnx, tmp_path_factory):
    return _write_repo(demo_onnx, tmp_path_factory.mktemp("inflight_repo") / "repo", "--batching", "inflight")


@pytest.fixture(scope="module")
def server(inflight_repo):
    yield from serve_until_teardown(inflight_repo)


@pytest.fixture(scope="module")
def vocab(inflight_repo) -> int:
    return json.loads((inflight_repo / MODEL / "1" / "generation.json").read_text())["vocab_size"]


def _grpc_stream(url: str, prompt: np.ndarray, n: int) -> tuple[list[int], list[float]]:
    """One gRPC stream request: the tokens and their arrival times (empty final response last)."""
    import tritonclient.grpc as grpcclient

    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    final, tokens, times = False, [], []
    try:
        ids = grpcclient.InferInput("input_ids", [1, prompt.size], "INT64")
        ids.set_data_from_numpy(prompt.reshape(1, -1).astype(np.int64))
        new = grpcclient.InferInput("max_new_tokens", [1, 1], "INT32")
        new.set_data_from_numpy(np.full((1, 1), n, np.int32))
        client.async_stream_infer(MODEL, [ids, new], enable_empty_final_response=True)
        for _ in range(n + 1):
            result, error = responses.get(timeout=DEADLINE_S)
            assert error is None, error
            final = result.get_response().parameters["triton_final_response"].bool_param
            if final:
                break
            tokens.append(int(result.as_numpy("output_ids").reshape(-1)[0]))
            times.append(time.monotonic())
        assert final
    finally:
        client.stop_stream(cancel_requests=not final)
        client.close()
    return tokens, times


def _run_threads(targets: list) -> None:
    run_concurrently(targets, DEADLINE_S + 30)


def test_repository_config_says_inflight(inflight_repo, demo_onnx, tmp_path):
    config = (inflight_repo / MODEL / "config.pbtxt").read_text()
    assert "decoupled: true" in config  # --batching inflight implies --streaming
    assert 'key: "batching" value: { string_value: "inflight" }' in config
    static = _write_repo(demo_onnx, tmp_path / "static", "--streaming", "--batching", "static")
    assert 'string_value: "static"' in (static / MODEL / "config.pbtxt").read_text()
    plain = _write_repo(demo_onnx, tmp_path / "plain")
    assert "decoupled: false" in (plain / MODEL / "config.pbtxt").read_text()
    from wide_export.cli import app

    result = CliRunner().invoke(app, ["triton", "--onnx", str(demo_onnx), "--output", str(tmp_path / "bad"),
                                      "--batching", "static"])
    assert result.exit_code == 2 and "--streaming" in result.output


def test_16_staggered_clients_get_the_reference_tokens(server, reference, vocab):
    rng = np.random.default_rng(10)
    jobs = [(rng.integers(0, vocab, size=int(rng.integers(1, 24))), int(rng.integers(2, 160)),
             0.02 * i + float(rng.uniform(0, 0.01))) for i in range(16)]
    got: dict[int, list[int]] = {}
    start = time.monotonic()

    def client(i: int):
        def run():
            prompt, n, delay = jobs[i]
            time.sleep(max(0.0, start + delay - time.monotonic()))
            if i % 2:
                got[i] = _grpc_stream(server.endpoints.grpc, prompt, n)[0]
            else:
                got[i] = Stream(server.endpoints.http, {"input_ids": prompt.tolist(), "max_new_tokens": n}).run().tokens
        return run

    _run_threads([client(i) for i in range(len(jobs))])
    for i, (prompt, n, _) in enumerate(jobs):
        np.testing.assert_array_equal(got[i], reference(prompt, n), err_msg=f"client {i}")
    # (that they joined running batches is shown by the next test, which static batching fails)


def test_a_short_request_during_long_streams_finishes_first(server, reference, vocab):
    """Static batching would start it only after the long ones ended, so it can never pass
    this; up to 3 tries, as a loaded CPU can delay one request's delivery."""
    rng = np.random.default_rng(11)
    long_n, short_n = 500, 3
    outcomes = []
    for _ in range(3):
        long_prompts, short_prompt = rng.integers(0, vocab, size=(4, 5)), rng.integers(0, vocab, size=9)
        longs = [Stream(server.endpoints.http, {"input_ids": p.tolist(), "max_new_tokens": long_n, "ignore_eos": True})
                 for p in long_prompts]
        short = Stream(server.endpoints.http, {"input_ids": short_prompt.tolist(), "max_new_tokens": short_n})

        def later():
            deadline = time.monotonic() + DEADLINE_S
            while min(len(s.events) for s in longs) < 5 and time.monotonic() < deadline:
                time.sleep(0.002)
            short.run()

        _run_threads([s.run for s in longs] + [later])
        np.testing.assert_array_equal(short.tokens, reference(short_prompt, short_n))
        for s, prompt in zip(longs, long_prompts):
            np.testing.assert_array_equal(s.tokens, reference(prompt, long_n, stop_at_eos=False))
        assert short.times[0] > max(s.times[0] for s in longs)  # it did arrive later
        outcomes.append(round(short.times[-1] - min(s.times[-1] for s in longs), 3))
        if outcomes[-1] < 0:  # its last token came before any long stream's last one
            return
    pytest.fail(f"the short request never finished before the long streams: {outcomes} s after them")


def test_malformed_requests_while_others_decode(server, reference, vocab):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    rng = np.random.default_rng(12)
    prompt = rng.integers(0, vocab, size=7)
    running = Stream(server.endpoints.http, {"input_ids": prompt.tolist(), "max_new_tokens": 150})
    bad_bodies = [
        ({"input_ids": [1, 2, 3], "max_new_tokens": 0}, "max_new_tokens must be >= 1"),
        ({"input_ids": [vocab], "max_new_tokens": 2}, "must lie in"),
        ({"input_ids": [1] * 500, "max_new_tokens": 100}, "exceeds the model's limit"),
        ({"input_ids": [1, 2], "max_new_tokens": 2, "top_p": 0.0}, "top_p"),
        ({"input_ids": [1, 2], "max_new_tokens": 2, "temperature": -1.0}, "temperature"),
    ]
    answers: list[Stream] = []
    grpc_errors: list[str] = []

    def malformed():
        deadline = time.monotonic() + DEADLINE_S
        while len(running.events) < 3 and time.monotonic() < deadline:
            time.sleep(0.002)
        for body, _ in bad_bodies:
            answers.append(Stream(server.endpoints.http, body).run())
        client = grpcclient.InferenceServerClient(server.endpoints.grpc)
        errors: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: errors.put(error))
        try:
            ids = grpcclient.InferInput("input_ids", [1, 3], "FP32")  # wrong dtype
            ids.set_data_from_numpy(np.ones((1, 3), np.float32))
            new = grpcclient.InferInput("max_new_tokens", [1, 1], "INT32")
            new.set_data_from_numpy(np.full((1, 1), 2, np.int32))
            client.async_stream_infer(MODEL, [ids, new])
            ids = grpcclient.InferInput("input_ids", [1, 3], "INT64")  # token ids AND text: which one?
            ids.set_data_from_numpy(np.ones((1, 3), np.int64))
            text = grpcclient.InferInput("text_input", [1, 1], "BYTES")
            text.set_data_from_numpy(np.array([[b"hello"]], dtype=object))
            client.async_stream_infer(MODEL, [ids, text])
            for _ in range(2):
                error = errors.get(timeout=DEADLINE_S)
                assert isinstance(error, InferenceServerException), error
                grpc_errors.append(str(error))
        finally:
            # Cancelling a stream after Triton itself rejected one of its requests (the wrong
            # dtype) keeps tritonserver from exiting (static batching too): cancel only if stuck.
            client.stop_stream(cancel_requests=len(grpc_errors) < 2)
            client.close()

    _run_threads([running.run, malformed])
    for answer, (_, message) in zip(answers, bad_bodies):
        assert answer.status == 400 and len(answer.events) == 1, (answer.status, answer.events)
        assert message in answer.events[0]["error"], answer.events
    assert any("FP32" in e or "data-type" in e or "datatype" in e.lower() for e in grpc_errors), grpc_errors
    assert any("exactly one of input_ids" in e for e in grpc_errors), grpc_errors
    np.testing.assert_array_equal(running.tokens, reference(prompt, 150))
    assert server.process.poll() is None and server.is_ready()


def test_clients_leaving_mid_stream_do_not_disturb_the_batch(server, reference, vocab, inflight_repo):
    """Two clients drop their connection after 2 and 10 events of a stream that would run to the end
    of the context; three others stream on beside them. Nothing waits for a time, only for conditions
    (each bounded, so a hang fails): the round's 5 requests released by the server, then the model's
    log line about each leaver (bounded: the log travels from the stub on its own path, so it may
    trail the release). The one thing a loaded machine can change is whether the server had already
    produced a leaver's whole stream when it left (then there was nobody to drop): a round in which
    the model did not notice both leavers proves nothing about leaving and is run again (at most 3
    rounds, each with the exact checks of the clients that stayed). A model that never notices a
    leaver fails every round."""
    rng = np.random.default_rng(13)
    url = server.endpoints.http
    context = json.loads((inflight_repo / MODEL / "1" / "generation.json").read_text())["max_total_tokens"]
    log = server.log_text
    rounds = []
    for _ in range(3):
        before, done = log().count("streaming client went away"), requests_done(server)
        prompts = [rng.integers(0, vocab, size=6) for _ in range(2)]
        # no max_new_tokens: the rest of the context, the longest a leaver's stream can be
        leavers = [Stream(url, {"input_ids": p.tolist(), "ignore_eos": True}, keep=k) for p, k in zip(prompts, (2, 10))]
        stayers = [(rng.integers(0, vocab, size=int(rng.integers(1, 16))), int(rng.integers(20, 60)))
                   for _ in range(3)]
        streams = [Stream(url, {"input_ids": p.tolist(), "max_new_tokens": n}) for p, n in stayers]
        _run_threads([s.run for s in leavers + streams])
        for s, (prompt, n) in zip(streams, stayers):
            np.testing.assert_array_equal(s.tokens, reference(prompt, n))
        assert [len(s.events) for s in leavers] == [2, 10]
        assert wait_until(lambda: requests_done(server) >= done + 5, DEADLINE_S), "requests never released"
        noticed = wait_until(lambda: log().count("streaming client went away") >= before + 2, 10.0)
        rounds.append({"left_mid_stream": [s.left_mid_stream for s in leavers], "noticed": noticed})
        if not noticed:
            continue  # the server outran a leaver: it had nothing left to send when the client left
        gone = [(int(n), int(of)) for n, of in re.findall(
            r"went away after (\d+) of (\d+) tokens; its rows left the batch", log())]
        assert all(n < of == context - 6 for n, of in gone[-2:]), gone  # dropped before their last token
        break
    else:
        pytest.fail(f"in 3 rounds the model never noticed both leavers: {rounds}")
    after = Stream(url, {"input_ids": [5, 6, 7], "max_new_tokens": 4}).run()
    np.testing.assert_array_equal(after.tokens, reference(np.array([5, 6, 7]), 4))


def test_the_server_stops_cleanly_with_streams_in_flight(inflight_repo):
    from wide_export.tritonserver import TritonServer
    from wide_export.tritonserver.server import python_stubs

    server = TritonServer(inflight_repo)
    server.start(timeout=120)
    pid = server.process.pid
    streams = [Stream(server.endpoints.http, {"input_ids": [3, 4, 5 + i], "max_new_tokens": 500, "ignore_eos": True})
               for i in range(3)]
    threads = [threading.Thread(target=s.run, daemon=True) for s in streams]
    try:
        for t in threads:
            t.start()
        deadline = time.monotonic() + DEADLINE_S
        while min(len(s.events) for s in streams) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert python_stubs(pid), "no python stub while streaming"
        began = time.monotonic()
        code = server.stop()
        took = time.monotonic() - began
    finally:
        if server.process is not None and server.process.poll() is None:
            server.process.kill()
    print(server.log_tail(15))
    assert code == 0, f"tritonserver did not stop cleanly (code {code})"
    assert took < 60, took
    for t in threads:
        t.join(DEADLINE_S)
    assert not any(t.is_alive() for t in threads)
    # Triton drains for up to --exit-timeout-secs: each stream got all its tokens or was cut, none hung
    assert all(3 <= len(s.events) <= 500 and all("error" not in e for e in s.events[:3]) for s in streams)
    assert not python_stubs(pid)
