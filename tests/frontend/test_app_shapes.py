"""serving/openai/app.py's answers field by field (OpenAI's shapes, written out here), for what tests/frontend/
test_app.py leaves open: model cards, token ids whole and streamed, counts from a model that reports none,
an engine that ends without a chunk, the lifespan, and the ids and timestamps of a stream.

The wording is the contract here for one case: test_engine_errors_keep_their_param pins an error answer's
whole JSON body as OpenAI clients read it (message, type, param, code). The other error cases assert the
status, the type and param, and the fact their message names, not its sentence."""

from __future__ import annotations

import time

from tests.frontend.conftest import make_client, sse_payloads
from tests.frontend.fakes import MODEL, PIECES, PROMPT_TOKENS, FakeEngine, served
from wide_export.serving.openai.engine import EngineError, GenerationChunk

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


def test_model_card_fields(engine):
    models = [served("a", max_model_len=32), served("b")]
    models[1].max_model_len = None
    models[1].triton_name = "b_triton"
    with make_client(engine, models) as client:
        cards = client.get("/v1/models").json()["data"]
        assert cards == [
            {"id": "a", "object": "model", "created": 0, "owned_by": "wide-export", "root": "a", "max_model_len": 32},
            {"id": "b", "object": "model", "created": 0, "owned_by": "wide-export", "root": "b_triton"}]
        assert client.get("/v1/models/b").json() == cards[1]


def test_health_answer_and_engine_lifecycle():
    engine = FakeEngine()
    with make_client(engine) as client:
        assert engine.started and not engine.closed
        resp = client.get("/health")
        assert resp.status_code == 200 and resp.json() == {"status": "ok"}
    assert engine.closed


def test_whole_answers_carry_no_fingerprint_and_a_current_timestamp(client):
    before = int(time.time())
    body = client.post("/v1/completions", json={"model": MODEL, "prompt": "x"}).json()
    assert body["system_fingerprint"] is None and "token_ids" not in body["choices"][0]
    assert before <= body["created"] <= int(time.time()) + 1
    chat = client.post("/v1/chat/completions", json=CHAT).json()
    assert chat["system_fingerprint"] is None and chat["model"] == MODEL
    assert "token_ids" not in chat["choices"][0]


def test_chat_whole_answer_with_token_ids(client):
    body = client.post("/v1/chat/completions", json={**CHAT, "return_token_ids": True}).json()
    assert body["choices"][0]["token_ids"] == [100 + i for i in range(len(PIECES))]
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "".join(PIECES)}


def test_streamed_completion_chunks_carry_their_token_ids_when_asked(client):
    events = sse_payloads(client.post("/v1/completions", json={
        "model": MODEL, "prompt": "x", "stream": True, "return_token_ids": True}).text)[:-1]
    assert [e["choices"][0]["token_ids"] for e in events] == [[100 + i] for i in range(len(PIECES))]
    assert all(e["system_fingerprint"] is None and e["model"] == MODEL for e in events)
    assert len({e["created"] for e in events}) == 1 and len({e["id"] for e in events}) == 1
    assert events[0]["id"].startswith("cmpl-")
    assert all(e["choices"][0]["index"] == 0 and e["choices"][0]["logprobs"] is None for e in events)


def test_streamed_chat_with_token_ids_sends_the_held_back_token_too(client):
    """The token whose text is held back ("") is sent as its own chunk when token ids are asked for."""
    events = sse_payloads(client.post("/v1/chat/completions", json={
        **CHAT, "stream": True, "return_token_ids": True}).text)[:-1]
    role, content = events[0], events[1:]
    assert role["choices"][0] == {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                  "finish_reason": None, "token_ids": []}
    assert [e["choices"][0]["delta"] for e in content] == [{"content": p} if p else {} for p in PIECES]
    assert [e["choices"][0]["token_ids"] for e in content] == [[100 + i] for i in range(len(PIECES))]
    assert role["id"].startswith("chatcmpl-") and len({e["id"] for e in events}) == 1


def test_streamed_chat_without_token_ids_has_none_in_its_chunks(client):
    events = sse_payloads(client.post("/v1/chat/completions", json={**CHAT, "stream": True}).text)[:-1]
    assert all("token_ids" not in e["choices"][0] for e in events)
    assert all("usage" not in e for e in events)


class _Silent(FakeEngine):
    """A model that reports no counts: the answer counts the token ids itself."""

    async def generate(self, request):
        self.requests.append(request)
        for i, piece in enumerate(("a", "b", "c")):
            yield GenerationChunk(text=piece, token_ids=(7, 8) if i == 1 else (7,),
                                  finish_reason="stop" if i == 2 else None)


def test_counts_come_from_the_token_ids_when_the_model_reports_none():
    with make_client(_Silent()) as client:
        body = client.post("/v1/completions", json={"model": MODEL, "prompt": [1, 2, 3]}).json()
        assert body["usage"] == {"prompt_tokens": 0, "completion_tokens": 4, "total_tokens": 4}
        assert body["choices"][0]["text"] == "abc" and body["choices"][0]["finish_reason"] == "stop"
        events = sse_payloads(client.post("/v1/completions", json={
            "model": MODEL, "prompt": "x", "stream": True, "stream_options": {"include_usage": True}}).text)
        assert events[-2]["usage"] == {"prompt_tokens": 0, "completion_tokens": 4, "total_tokens": 4}


def test_reported_counts_win_over_counting():
    """The model's cumulative counts are taken as they are (the last one), not added up."""
    with make_client(FakeEngine()) as client:
        body = client.post("/v1/completions", json={"model": MODEL, "prompt": "x"}).json()
    assert body["usage"] == {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": len(PIECES),
                             "total_tokens": PROMPT_TOKENS + len(PIECES)}


class _Empty(FakeEngine):
    async def generate(self, request):
        self.requests.append(request)
        return
        yield  # an async generator that ends at once


def test_an_engine_that_ends_without_a_chunk_is_an_empty_stop():
    with make_client(_Empty()) as client:
        body = client.post("/v1/completions", json={"model": MODEL, "prompt": "x"}).json()
        assert body["choices"][0]["text"] == "" and body["choices"][0]["finish_reason"] == "stop"
        assert body["usage"]["completion_tokens"] == 0
        events = sse_payloads(client.post("/v1/chat/completions", json={**CHAT, "stream": True}).text)
        assert [(e["choices"][0]["delta"], e["choices"][0]["finish_reason"]) for e in events[:-1]] == [
            ({"role": "assistant", "content": ""}, None), ({}, "stop")]
        assert events[-1] == "[DONE]"


class _Unfinished(FakeEngine):
    """Chunks without a finish_reason, then the end: the whole answer has none either."""

    async def generate(self, request):
        self.requests.append(request)
        yield GenerationChunk(text="a", token_ids=(1,))
        yield GenerationChunk(text="b", token_ids=(2,))


def test_a_generation_that_ends_without_a_finish_reason():
    with make_client(_Unfinished()) as client:
        body = client.post("/v1/completions", json={"model": MODEL, "prompt": "x"}).json()
        assert body["choices"][0]["text"] == "ab" and body["choices"][0]["finish_reason"] is None
        events = sse_payloads(client.post("/v1/completions", json={"model": MODEL, "prompt": "x",
                                                                   "stream": True}).text)
        assert [e["choices"][0]["text"] for e in events[:-1]] == ["a", "b"] and events[-1] == "[DONE]"


def test_the_finish_reason_is_the_last_one_given():
    class Two(FakeEngine):
        async def generate(self, request):
            yield GenerationChunk(text="a", token_ids=(1,), finish_reason="length")

    with make_client(Two()) as client:
        body = client.post("/v1/chat/completions", json=CHAT).json()
    assert body["choices"][0]["finish_reason"] == "length"


def test_an_unexpected_error_mid_stream_is_a_500_event():
    class Broken(FakeEngine):
        async def generate(self, request):
            yield GenerationChunk(text="a", token_ids=(1,))
            raise KeyError("oops")

    with make_client(Broken()) as client:
        events = sse_payloads(client.post("/v1/completions", json={"model": MODEL, "prompt": "x",
                                                                   "stream": True}).text)
    assert events[0]["choices"][0]["text"] == "a"
    error = events[-2]["error"]
    assert set(events[-2]) == {"error"} and set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["param"], error["code"]) == ("server_error", None, None)
    assert "KeyError" in error["message"] and "'oops'" in error["message"]
    assert events[-1] == "[DONE]"


def test_engine_errors_keep_their_param():
    engine = FakeEngine(fail=EngineError("invalid", "model x does not take seed", param="seed"))
    with make_client(engine) as client:
        resp = client.post("/v1/completions", json={"model": MODEL, "prompt": "x", "seed": 1})
    assert resp.status_code == 400
    assert resp.json()["error"] == {"message": "model x does not take seed", "type": "invalid_request_error",
                                    "param": "seed", "code": None}


def test_an_unexpected_error_before_the_answer_is_a_500():
    class Broken(FakeEngine):
        async def generate(self, request):
            raise RuntimeError("engine bug")
            yield

    from fastapi.testclient import TestClient

    from wide_export.serving.openai.app import create_app

    # the server's own exception is re-raised into TestClient by default: here the answer is looked at
    with TestClient(create_app(Broken(), [served()]), raise_server_exceptions=False) as client:
        resp = client.post("/v1/completions", json={"model": MODEL, "prompt": "x"})
    assert resp.status_code == 500 and resp.json()["error"]["type"] == "server_error"
    assert "RuntimeError" in resp.json()["error"]["message"] and "engine bug" in resp.json()["error"]["message"]


def test_mid_stream_engine_error_of_kind_unavailable_is_typed_so():
    engine = FakeEngine(fail_after=1)
    with make_client(engine) as client:
        events = sse_payloads(client.post("/v1/completions", json={"model": MODEL, "prompt": "x",
                                                                   "stream": True}).text)
    assert events[-2]["error"]["type"] == "server_error" and events[-2]["error"]["param"] is None


def test_a_model_without_a_tokenizer_loaded_refuses_text_with_its_reason():
    model = served()
    model.text = None  # nothing loaded: text_of() fills in a ModelText saying so
    with make_client(FakeEngine(), [model]) as client:
        resp = client.post("/v1/completions", json={"model": MODEL, "prompt": "hi"})
        assert resp.status_code == 400 and resp.json()["error"]["param"] == "prompt"
        assert "no tokenizer" in resp.json()["error"]["message"]
        assert client.post("/v1/completions", json={"model": MODEL, "prompt": [1]}).status_code == 200


def test_usage_chunk_shape(client):
    events = sse_payloads(client.post("/v1/completions", json={
        "model": MODEL, "prompt": "x", "stream": True, "stream_options": {"include_usage": True}}).text)
    usage = events[-2]
    assert set(usage) == {"id", "object", "created", "model", "choices", "usage", "system_fingerprint"}
    assert usage["system_fingerprint"] is None and usage["choices"] == [] and usage["object"] == "text_completion"


def test_a_stream_error_is_logged_with_its_traceback(caplog):
    import logging

    class Broken(FakeEngine):
        async def generate(self, request):
            yield GenerationChunk(text="a", token_ids=(1,))
            raise KeyError("oops")

    with caplog.at_level(logging.ERROR, logger="wide_export.serving.openai"), make_client(Broken()) as client:
        client.post("/v1/completions", json={"model": MODEL, "prompt": "x", "stream": True})
    (record,) = [r for r in caplog.records if r.name == "wide_export.serving.openai"]
    assert record.getMessage() == "error while streaming a generation" and record.exc_info is not None


def test_no_docs_pages_and_the_api_title(client):
    for path in ("/docs", "/redoc"):
        resp = client.get(path)
        assert resp.status_code == 404 and set(resp.json()) == {"error"}
    assert client.get("/openapi.json").json()["info"]["title"] == "wide-export OpenAI-compatible API"


def test_startup_error_is_kept_for_the_runner():
    from fastapi.testclient import TestClient

    from wide_export.serving.openai.app import create_app

    app = create_app(FakeEngine(), [served()])
    assert app.state.startup_error is None
    with TestClient(app):
        assert app.state.startup_error is None

    class Failing(FakeEngine):
        async def start(self):
            raise ConnectionError("no server")

    failing = create_app(Failing(), [served()])
    with TestClient(failing):
        assert isinstance(failing.state.startup_error, ConnectionError)


def test_the_model_is_required_with_several(engine):
    with make_client(engine, [served("a"), served("b")]) as client:
        resp = client.post("/v1/completions", json={"prompt": "x"})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "model"
    assert "model is required" in resp.json()["error"]["message"]


def test_ignored_fields_are_logged_by_name(engine, caplog):
    import logging

    with caplog.at_level(logging.WARNING, logger="wide_export.serving.openai"), make_client(engine) as client:
        client.post("/v1/completions", json={"model": MODEL, "prompt": "x", "top_k": 5, "min_p": 0.1})
        client.post("/v1/completions", json={"model": MODEL, "prompt": "x", "x\nERROR forged line": 1})
    # escaped: a newline in a client's field name cannot start a log line of its own
    assert [r.getMessage() for r in caplog.records if r.name == "wide_export.serving.openai"] == [
        "ignored request fields: 'min_p', 'top_k'", "ignored request fields: 'x\\nERROR forged line'"]


def test_a_slow_engine_is_awaited_not_taken_for_a_leaving_client():
    engine = FakeEngine(delay=0.05)
    with make_client(engine) as client:
        resp = client.post("/v1/completions", json={"model": MODEL, "prompt": "x"})
    assert resp.status_code == 200 and resp.json()["choices"][0]["text"] == "".join(PIECES)
    assert not engine.cancelled.is_set()
