"""`wide-export triton --streaming` on a real tritonserver (127.0.0.1): the decoupled
generation model streams one response per new token through Triton's generate
extension (HTTP server-sent events) and gRPC streams; streamed tokens equal the
PyTorch reference's greedy tokens; a client that leaves mid-stream does not
disturb the server. Every loop is bounded in count and time.
"""

from __future__ import annotations

import json
import queue
import re

import numpy as np
import pytest
from typer.testing import CliRunner

from tests.triton.sse_stream import Stream
from tests.triton.support import requests_done, run_concurrently, serve_until_teardown, wait_until

MODEL = "wide_llm"
DEADLINE_S = 60.0


@pytest.fixture(scope="module")
def streaming_repo(demo_onnx, tmp_path_factory):
    from wide_export.cli import app

    out = tmp_path_factory.mktemp("stream_repo") / "repo"
    result = CliRunner().invoke(app, ["triton", "--onnx", str(demo_onnx), "--output", str(out), "--streaming"])
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def streaming_server(streaming_repo):
    yield from serve_until_teardown(streaming_repo)


@pytest.fixture(scope="module")
def vocab(streaming_repo) -> int:
    return json.loads((streaming_repo / MODEL / "1" / "generation.json").read_text())["vocab_size"]


def _post_stream(http_url: str, body: dict) -> list[dict]:
    """POST /generate_stream; the server-sent events (`data: {...}`) it answered."""
    stream = Stream(http_url, body, model=MODEL).run()
    assert stream.content_type.startswith("text/event-stream")
    assert stream.status in (200, 400), stream.status  # a rejected request: 400 and one `error` event
    return stream.events


def test_streaming_repository_is_decoupled(streaming_repo):
    config = (streaming_repo / MODEL / "config.pbtxt").read_text()
    assert "model_transaction_policy { decoupled: true }" in config


def test_generate_stream_tokens_equal_the_reference(streaming_server, reference, vocab):
    rng = np.random.default_rng(0)
    for _ in range(3):
        prompt = rng.integers(0, vocab, size=int(rng.integers(1, 20))).tolist()
        n = int(rng.integers(2, 12))
        events = _post_stream(streaming_server.endpoints.http, {"input_ids": prompt, "max_new_tokens": n})
        assert all("error" not in e for e in events), events
        assert len(events) == n  # one event per new token (the final empty response adds none)
        got = [int(np.asarray(e["output_ids"]).reshape(-1)[0]) for e in events]
        np.testing.assert_array_equal(got, reference(np.array(prompt), n))


def test_generate_stream_reports_bad_requests(streaming_server, vocab):
    events = _post_stream(streaming_server.endpoints.http, {"input_ids": [1, 2, 3], "max_new_tokens": 0})
    assert len(events) == 1 and "max_new_tokens must be >= 1" in events[0]["error"]
    events = _post_stream(streaming_server.endpoints.http, {"input_ids": [vocab], "max_new_tokens": 2})
    assert len(events) == 1 and "must lie in" in events[0]["error"]


def test_grpc_stream_one_response_per_token_then_empty_final(streaming_server, reference, vocab):
    import tritonclient.grpc as grpcclient

    rng = np.random.default_rng(1)
    prompts = rng.integers(0, vocab, size=(2, 6), dtype=np.int64)
    n = 5
    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(streaming_server.endpoints.grpc)
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    final = False
    try:
        ids = grpcclient.InferInput("input_ids", list(prompts.shape), "INT64")
        ids.set_data_from_numpy(prompts)
        new = grpcclient.InferInput("max_new_tokens", [2, 1], "INT32")
        new.set_data_from_numpy(np.full((2, 1), n, np.int32))
        client.async_stream_infer(MODEL, [ids, new], enable_empty_final_response=True)
        got = []
        for _ in range(n + 1):
            result, error = responses.get(timeout=DEADLINE_S)
            assert error is None, error
            final = result.get_response().parameters["triton_final_response"].bool_param
            if final:
                assert result.as_numpy("output_ids") is None  # the last response is empty
                break
            got.append(result.as_numpy("output_ids"))
        assert final and len(got) == n
        assert all(step.shape == (2, 1) for step in got)
        tokens = np.concatenate(got, axis=1)
        for row, prompt in zip(tokens, prompts):
            np.testing.assert_array_equal(row, reference(prompt, n))
    finally:
        client.stop_stream(cancel_requests=not final)  # a stream the server never closed must not hang here
        client.close()


def test_client_leaving_mid_stream_does_not_break_the_server(streaming_server, reference, vocab):
    """Two clients, one after the other, drop their connection after 2 events of a 400-token stream;
    the model notices each (the request is cancelled) and stops decoding it before its end.
    A loaded machine can change one thing: whether the server had already produced the whole stream
    when the client left (then there was nobody to drop; CI saw this once). So each try waits for
    conditions, never for a time: the request released by the server (bounded by DEADLINE_S, so a
    hang fails), then the model's log line about the client (bounded: the log travels from the stub
    on its own path, so it may trail the release). A try whose stream ended without that line, or
    whose last token had reached the client before it left, proves nothing about leaving and is run
    again (at most 6 tries for the 2 leavers). A model that never notices a leaver fails every try."""
    rng = np.random.default_rng(2)
    url = streaming_server.endpoints.http
    log = streaming_server.log_text
    left, tries = [], []
    while len(left) < 2 and len(tries) < 6:
        before, done = log().count("streaming client went away"), requests_done(streaming_server)
        body = {"input_ids": rng.integers(0, vocab, size=8).tolist(), "max_new_tokens": 400, "ignore_eos": True}
        leaver = Stream(url, body, keep=2, model=MODEL).run()
        assert len(leaver.events) == 2 and "error" not in leaver.events[0], leaver.events
        assert wait_until(lambda: requests_done(streaming_server) > done, DEADLINE_S), "request never released"
        noticed = wait_until(lambda: log().count("streaming client went away") > before, 10.0)
        tries.append({"left_mid_stream": leaver.left_mid_stream, "noticed": noticed})
        if noticed:
            left.append(tuple(map(int, re.findall(r"went away after (\d+) of (\d+) tokens", log())[-1])))
    assert len(left) == 2, f"in {len(tries)} tries the model noticed a leaving client {len(left)} times: {tries}"
    assert all(n < of == 400 for n, of in left), left  # dropped before their last token
    # meanwhile and afterwards, concurrent clients are served exactly
    jobs = [(rng.integers(0, vocab, size=int(rng.integers(1, 16))).tolist(), int(rng.integers(2, 10)))
            for _ in range(4)]
    results: dict[int, list[int]] = {}

    def run(i: int) -> None:
        events = _post_stream(url, {"input_ids": jobs[i][0], "max_new_tokens": jobs[i][1]})
        results[i] = [int(np.asarray(e["output_ids"]).reshape(-1)[0]) for e in events]

    run_concurrently([lambda i=i: run(i) for i in range(len(jobs))], DEADLINE_S + 10)
    for i, (prompt, n) in enumerate(jobs):
        np.testing.assert_array_equal(results[i], reference(np.array(prompt), n))
    assert streaming_server.process.poll() is None and streaming_server.is_ready()


def _tokens(events: list[dict]) -> list[int]:
    assert all("error" not in e for e in events), events
    return [int(np.asarray(e["output_ids"]).reshape(-1)[0]) for e in events]


def test_generate_stream_takes_the_optional_sampling_inputs(streaming_server, reference, vocab):
    url = streaming_server.endpoints.http
    prompt = np.random.default_rng(3).integers(0, vocab, size=6).tolist()
    hot = {"input_ids": prompt, "max_new_tokens": 8, "temperature": 1.5, "top_p": 0.9, "seed": 11}
    a, b = _tokens(_post_stream(url, hot)), _tokens(_post_stream(url, hot))
    assert a == b and len(a) == 8  # seeded sampling is reproducible
    cold = _tokens(_post_stream(url, {**hot, "temperature": 0.0}))
    np.testing.assert_array_equal(cold, reference(np.array(prompt), 8))  # temperature 0 is greedy


def test_plain_infer_is_refused_by_the_streaming_model(streaming_server):
    from tritonclient.utils import InferenceServerException

    from wide_export.tritonserver.client import GenerationClient

    with GenerationClient(streaming_server.endpoints.http, "http", MODEL) as client:
        with pytest.raises(InferenceServerException, match="decoupled"):
            client.generate(np.array([1, 2, 3]), 2)


def test_tensorrt_flavour_streams_over_stand_in_engines(tiny, tmp_path):
    """The BLS generation model streams too (the tensorrt_plan model replaced by a Python stand-in
    that run the tiny ONNX model, as in test_triton_bls.py); tokens equal the numpy reference."""
    from tests.triton import tiny_llm
    from tests.triton.engine_manifest import write_engine_folder
    from tests.triton.test_triton_bls import use_stand_in_engine
    from wide_export.tritonserver import RepoOptions, TritonServer, generate_repository

    folder, weights = tiny
    write_engine_folder(tmp_path / "engines", layers=tiny_llm.LAYERS, vocab=tiny_llm.VOCAB, kv_type="float32",
                        heads=tiny_llm.KV_HEADS, dim=tiny_llm.HEAD_DIM, max_pos=tiny_llm.MAX_POS)
    repo = generate_repository(tmp_path / "repo", engines=tmp_path / "engines",
                               options=RepoOptions(max_batch=4, streaming=True))
    use_stand_in_engine(repo, folder)
    rng = np.random.default_rng(6)
    with TritonServer(repo) as server:
        for _ in range(2):
            prompt = rng.integers(0, tiny_llm.VOCAB, size=int(rng.integers(1, 12)))
            n = int(rng.integers(2, 8))
            events = _post_stream(server.endpoints.http, {"input_ids": prompt.tolist(), "max_new_tokens": n})
            assert len(events) == n
            np.testing.assert_array_equal(_tokens(events), tiny_llm.reference_greedy(weights, prompt, n))
