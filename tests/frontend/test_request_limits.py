"""Size limits before any work, the operator's max_tokens cap, templating off the event loop and a graceful
stop that ends open streams with an error event and [DONE], over a fake engine."""

from __future__ import annotations

import contextlib
import http.client
import json
import threading
import time
from urllib.parse import urlsplit

import pytest

from tests.frontend.conftest import sse_payloads
from tests.frontend.fakes import FakeEngine, FakeTokenizer, served
from wide_export.serving.openai.admission import RequestPolicy
from wide_export.serving.openai.chat import ModelText


class VocabTokenizer(FakeTokenizer):
    """A fake tokenizer whose longest token string is 3 characters."""

    def __init__(self, render_seconds: float = 0.0):
        super().__init__()
        self.render_seconds = render_seconds

    def get_vocab(self):
        return {"a": 0, "bc": 1, "def": 2}

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        time.sleep(self.render_seconds)  # a long template rendering, which holds its thread
        return super().apply_chat_template(messages, tokenize, add_generation_prompt)


def _exchange(base: str, method: str, path: str, body=None, timeout: float = 30) -> tuple[int, dict, str]:
    """Status, headers (lower-case names) and body of one request."""
    where = urlsplit(base)
    conn = http.client.HTTPConnection(where.hostname, where.port, timeout=timeout)
    try:
        conn.request(method, path, body=None if body is None else json.dumps(body),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read().decode()
    finally:
        conn.close()


def _call(base: str, method: str, path: str, body=None, timeout: float = 30) -> tuple[int, str]:
    status, _, text = _exchange(base, method, path, body, timeout)
    return status, text


def _model(max_model_len=10, render_seconds=0.0):
    return served(max_model_len=max_model_len, text=ModelText(VocabTokenizer(render_seconds)))


def _app(engine, policy=None, **kw):
    from fastapi.testclient import TestClient

    from wide_export.serving.openai.app import create_app

    return TestClient(create_app(engine, [_model(**kw)], policy))


def _error(resp, status, param):
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert error["param"] == param, error
    return error


def test_a_text_longer_than_the_context_can_hold_is_a_400_before_the_engine():
    engine = FakeEngine()
    with _app(engine) as client:  # 10 tokens of at most 3 characters: 30 characters
        ok = client.post("/v1/completions", json={"prompt": "x" * 30, "max_tokens": 2})
        assert ok.status_code == 200, ok.text
        error = _error(client.post("/v1/completions", json={"prompt": "x" * 31, "max_tokens": 2}), 400, "prompt")
        assert error["code"] == "context_length_exceeded" and "31 characters" in error["message"]
    assert len(engine.requests) == 1


def test_token_ids_and_messages_over_the_context_are_400s():
    engine = FakeEngine()
    with _app(engine) as client:
        _error(client.post("/v1/completions", json={"prompt": list(range(11)), "max_tokens": 2}), 400, "prompt")
        many = [{"role": "user", "content": ""}] * 11
        assert "11 messages" in _error(client.post("/v1/chat/completions", json={"messages": many}), 400,
                                       "messages")["message"]
        long = [{"role": "user", "content": "x" * 20}, {"role": "user", "content": "y" * 11}]
        _error(client.post("/v1/chat/completions", json={"messages": long}), 400, "messages")
        # the rendered prompt counts too: 2 messages of 14 characters fit, their template does not
        fits = [{"role": "user", "content": "x" * 14}]
        _error(client.post("/v1/chat/completions", json={"messages": fits * 2}), 400, "messages")
        assert client.post("/v1/completions", json={"prompt": list(range(10)), "max_tokens": 2}).status_code == 200
    assert len(engine.requests) == 1


def test_the_operators_max_tokens_cap():
    engine = FakeEngine()
    with _app(engine, RequestPolicy(max_tokens=5)) as client:
        assert client.post("/v1/completions", json={"prompt": "a", "max_tokens": 5}).status_code == 200
        error = _error(client.post("/v1/completions", json={"prompt": "a", "max_tokens": 6}), 400, "max_tokens")
        assert "limit of 5" in error["message"]
        _error(client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "a"}],
                                                         "max_completion_tokens": 9}), 400, "max_completion_tokens")
        assert client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "a"}]}
                           ).status_code == 200
    assert [r.max_tokens for r in engine.requests] == [5, 5]  # a chat that asks for none gets the cap


def test_chat_templating_runs_off_the_event_loop(live):
    """A slow template (5 s) must not hold /health: it answered after the template before."""
    frontend = live(FakeEngine(), [_model(max_model_len=1000, render_seconds=5.0)])
    base = frontend.url[:-3]
    done = []
    slow = threading.Thread(target=lambda: done.append(_call(
        base, "POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})))
    slow.start()
    time.sleep(0.3)
    t0 = time.monotonic()
    assert _call(base, "GET", "/health")[0] == 200
    waited = time.monotonic() - t0
    slow.join(30)
    assert done and done[0][0] == 200
    assert waited < 2.5, f"/health waited {waited:.1f} s for the chat template"


@pytest.mark.parametrize("stream", [True, False])
def test_a_graceful_stop_ends_open_requests_with_an_error_and_done(live, stream):
    engine = FakeEngine(delay=0.05, endless=True)
    model = served()
    model.slots = 8  # all four run (a request still waiting for a slot gets a 503 too)
    frontend = live(engine, [model])
    base = frontend.url[:-3]
    got = []

    def ask():
        got.append(_call(base, "POST", "/v1/completions", {"prompt": "a", "max_tokens": 10 ** 6, "stream": stream}))

    clients = [threading.Thread(target=ask) for _ in range(4)]
    for t in clients:
        t.start()
    time.sleep(0.5)
    t0 = time.monotonic()
    frontend.stop()
    stopped = time.monotonic() - t0
    for t in clients:
        t.join(10)
    assert len(got) == 4, got
    for status, text in got:
        if stream:
            assert status == 200
            events = sse_payloads(text)
            assert events[-1] == "[DONE]" and "shutting down" in events[-2]["error"]["message"], events[-3:]
        else:
            assert status == 503 and "shutting down" in text, (status, text)
    assert stopped < 2.7, f"the stop took {stopped:.1f} s"  # the streams ended: not cancelled after GRACEFUL_S (3 s)


def test_a_full_queue_answers_429_to_the_client_that_filled_it_and_503_to_others_with_retry_after():
    """One slot, two may wait, one client at most one of them: what each gets, over a real server."""
    from wide_export.serving.openai.runner import Frontend, bind_socket

    model = served()
    model.slots = 1
    frontend = Frontend([model], bind_socket("127.0.0.1", 0), engine=FakeEngine(delay=0.05, endless=True),
                        policy=RequestPolicy(max_waiting=2)).start()
    base = frontend.url[:-3]
    queue = frontend.app.state.queues[model.name]

    def hold(user: str, busy: int, waiting: int) -> None:
        """An endless stream for `user`, in the background, once the queue shows it (running or waiting)."""
        body = {"prompt": "a", "max_tokens": 10 ** 6, "stream": True, "user": user}

        def stream() -> None:
            with contextlib.suppress(OSError):  # cut by the stop at the end of the test
                _exchange(base, "POST", "/v1/completions", body)

        threading.Thread(target=stream, daemon=True).start()
        deadline = time.monotonic() + 30
        while (queue.busy, len(queue.waiting)) != (busy, waiting):
            assert time.monotonic() < deadline, (queue.busy, queue.waiting)
            time.sleep(0.02)

    try:
        hold("a", 1, 0)  # runs
        hold("a", 1, 1)  # waits
        third = _exchange(base, "POST", "/v1/completions", {"prompt": "a", "max_tokens": 2, "user": "a"})
        assert third[0] == 429, third
        hold("b", 1, 2)  # waits: the queue is full
        fourth = _exchange(base, "POST", "/v1/completions", {"prompt": "a", "max_tokens": 2, "user": "c"})
        assert fourth[0] == 503, fourth
        for status, headers, text in (third, fourth):
            assert headers.get("retry-after") == "1", headers
            error = json.loads(text)["error"]
            assert error["code"] == "too_many_requests", error
            assert error["type"] == ("rate_limit_exceeded" if status == 429 else "service_unavailable"), error
    finally:
        frontend.stop()
