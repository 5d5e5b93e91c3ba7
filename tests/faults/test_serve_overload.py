"""`wide-export serve --openai-port` against oversized requests, a burst from one client and a SIGTERM with
streams open, on a real tritonserver: each case timed."""

from __future__ import annotations

import http.client
import json
import signal
import statistics
import threading
import time

import numpy as np
import pytest

from tests.conftest import demo_onnx  # noqa: F401 - fixture
from tests.faults.test_serve_hostile import Serve, _get, _openai_address
from tests.triton.conftest import demo_repo, reference  # noqa: F401 - fixtures

pytestmark = pytest.mark.usefixtures("tritonserver_available")


@pytest.fixture(scope="module")
def streaming_repo(demo_onnx, tmp_path_factory):  # noqa: F811
    """The demo model (a 512-token context: streams that last) with in-flight batching of 16 rows."""
    from wide_export.tritonserver import RepoOptions, generate_repository

    return generate_repository(tmp_path_factory.mktemp("stream") / "repo", onnx=demo_onnx,
                               options=RepoOptions(streaming=True, max_batch=16))


def _post(address, path: str, body: bytes, timeout: float = 120) -> tuple[int, dict, float]:
    t0 = time.monotonic()
    conn = http.client.HTTPConnection(*address, timeout=timeout)
    try:
        try:
            conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused before the whole body went out: the answer is still there to read
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"{}"), time.monotonic() - t0
    finally:
        conn.close()


def _health_while(address, busy: threading.Thread) -> list[float]:
    """/health answer times, asked again and again while `busy` runs."""
    times = []
    while busy.is_alive() or not times:
        t0 = time.monotonic()
        assert _get(address, "/health", timeout=60) == 200
        times.append(time.monotonic() - t0)
        time.sleep(0.05)
    return times


def test_oversized_requests_are_refused_before_work_and_health_never_waits(demo_repo):  # noqa: F811
    """A 4 MB prompt was tokenized whole (9-45 s, every new request waiting); 10^5 messages took 11 s; 10^7
    token ids peaked at 3.25 GB; a 100 MB body with an unknown field was a 200."""
    serve = Serve(demo_repo, "--openai-port", "0", "--max-body-bytes", str(16 << 20))
    try:
        address = _openai_address(serve)
        cases = [
            ("/v1/completions", {"model": "wide_llm", "prompt": "a" * 4_000_000, "max_tokens": 4}, 400),
            ("/v1/chat/completions", {"model": "wide_llm", "messages": [{"role": "user", "content": "hi"}] * 10 ** 5},
             400),
            ("/v1/completions", {"model": "wide_llm", "prompt": [1] * 10 ** 6, "max_tokens": 4}, 400),
            ("/v1/completions", {"model": "wide_llm", "prompt": [1] * 10 ** 7, "max_tokens": 4}, 413),
            ("/v1/completions", {"model": "wide_llm", "prompt": "hi", "junk": "x" * 100_000_000}, 413),
        ]
        for path, body, want in cases:
            payload = json.dumps(body).encode()
            result = []
            asker = threading.Thread(target=lambda: result.append(_post(address, path, payload)))
            asker.start()
            health = _health_while(address, asker)
            asker.join()
            status, answer, took = result[0]
            print(f"{len(payload) / 1e6:.1f} MB body -> {status} in {took:.2f} s; /health max {max(health):.3f} s")
            assert status == want, (status, answer)
            assert answer["error"]["code"] in ("context_length_exceeded", "request_too_large"), answer
            assert took < 10, f"{len(payload)} bytes took {took:.1f} s to refuse"
            assert max(health) < 3.0, f"/health waited {max(health):.2f} s"
        assert serve.proc.poll() is None
    finally:
        assert serve.stop() == 130, serve.output()


def _stream_events(address, body: dict, out: list, opened: threading.Event) -> None:
    conn = http.client.HTTPConnection(*address, timeout=120)
    conn.request("POST", "/v1/completions", body=json.dumps({**body, "stream": True}),
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    events = []
    for line in resp:
        line = line.decode().strip()
        if line.startswith("data: "):
            events.append(line[6:])
            opened.set()
    out.append((resp.status, events))


def test_sigterm_with_open_streams_ends_each_with_an_error_event_and_done(streaming_repo):
    """16 open streams at SIGTERM: a CancelledError traceback was printed and 8 streams ended without [DONE]."""
    serve = Serve(streaming_repo, "--openai-port", "0", "--max-running-per-client", "16")
    address = _openai_address(serve)
    results: list = []
    opened = [threading.Event() for _ in range(16)]
    body = {"model": "wide_llm", "prompt": [1, 2, 3], "max_tokens": 500, "ignore_eos": True}
    threads = [threading.Thread(target=_stream_events, args=(address, body, results, opened[k]), daemon=True)
               for k in range(16)]
    for t in threads:
        t.start()
    assert all(e.wait(60) for e in opened), "the streams did not all start"
    serve.proc.send_signal(signal.SIGTERM)
    code = serve.proc.wait(60)
    for t in threads:
        t.join(30)
    assert code == 143, serve.output()  # 128 + SIGTERM, as every command
    assert "Traceback" not in serve.output() and "CancelledError" not in serve.output(), serve.output()
    assert len(results) == 16
    for status, events in results:
        assert status == 200 and events[-1] == "[DONE]", events[-3:]
        assert "shutting down" in json.loads(events[-2])["error"]["message"], events[-3:]


def test_one_clients_burst_does_not_starve_another(streaming_repo, reference):  # noqa: F811
    """64 long requests from one client made another client's 8-token request wait 20.8 s (behind all of
    them). Now that client's burst holds all rows but one, and the other request starts at once.

    Asserted by order, not by time: the other request may end only after burst requests that were already
    running when it came (15 rows of 16); first come first served made it wait for the ~48 queued ones."""
    serve = Serve(streaming_repo, "--openai-port", "0")
    try:
        address = _openai_address(serve)
        long = json.dumps({"model": "wide_llm", "prompt": [1, 2, 3], "max_tokens": 200, "ignore_eos": True,
                           "user": "burst"}).encode()
        burst: list = []

        def one_long():
            status, _, took = _post(address, "/v1/completions", long)
            burst.append((status, took, time.monotonic()))

        threads = [threading.Thread(target=one_long) for _ in range(64)]
        for t in threads:
            t.start()
        time.sleep(1.0)  # the burst is running and queued
        prompt = np.array([5, 17, 99, 3, 42])
        sent = time.monotonic()
        status, answer, waited = _post(address, "/v1/completions", json.dumps(
            {"model": "wide_llm", "prompt": prompt.tolist(), "max_tokens": 8, "temperature": 0,
             "return_token_ids": True, "user": "other"}).encode())
        done = time.monotonic()
        for t in threads:
            t.join(300)
        assert status == 200 and answer["choices"][0]["token_ids"] == reference(prompt, 8).tolist(), answer
        assert len(burst) == 64 and all(s == 200 for s, _, _ in burst)
        before = sum(1 for _, _, end in burst if end <= sent)
        during = sum(1 for _, _, end in burst if sent < end <= done)
        print(f"other client's 8 tokens: {waited:.2f} s, while {during} burst requests ended ({before} had "
              f"ended before it came); a burst request: {statistics.median(t for _, t, _ in burst):.2f} s; "
              f"whole burst {max(t for _, t, _ in burst):.2f} s")
        assert 64 - before > 16, f"only {64 - before} burst requests were left when the other came: no queue"
        assert during <= 15, f"the other client waited for {during} burst requests to end (at most 15 ran)"
    finally:
        assert serve.stop() == 130, serve.output()


def test_models_report_their_batch_size_as_slots(tiny, tmp_path):
    from wide_export.serving.openai.models import discover
    from wide_export.tritonserver import RepoOptions, generate_repository

    repo = generate_repository(tmp_path / "r", onnx=tiny[0], options=RepoOptions(max_batch=5))
    assert [m.slots for m in discover(repo)] == [5]
    assert np.int64(5) == 5
