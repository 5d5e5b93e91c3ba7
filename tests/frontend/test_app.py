"""The OpenAI routes in-process (FastAPI TestClient) on a scripted engine."""

from __future__ import annotations

import logging

import pytest

from tests.frontend.conftest import make_client, sse_payloads
from tests.frontend.fakes import MODEL, PIECES, PROMPT_TOKENS, FakeEngine, FakeTokenizer, served
from wide_export.serving.openai.chat import NO_TEMPLATE, ModelText
from wide_export.serving.openai.engine import EngineError

FULL_TEXT = "".join(PIECES)
CHAT = {"model": MODEL, "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]}


def _post_json(client, path: str, body: dict):
    """Posted as JSON with \\u escapes (what a client sends for a lone surrogate: httpx cannot encode one)."""
    import json

    return client.post(path, content=json.dumps(body).encode(), headers={"content-type": "application/json"})


def assert_openai_error(resp, status: int, param=None, contains: str = ""):
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"] and isinstance(err["type"], str)
    if param is not None:
        assert err["param"] == param, err
    assert contains in err["message"], err
    return err


# -- models and health
def test_models_lists_the_served_models(client):
    listing = client.get("/v1/models").json()
    assert listing["object"] == "list"
    assert [(m["id"], m["object"], m["owned_by"], m["max_model_len"]) for m in listing["data"]] == [
        (MODEL, "model", "wide-export", 64)]
    assert client.get(f"/v1/models/{MODEL}").json()["id"] == MODEL
    assert_openai_error(client.get("/v1/models/nope"), 404, param="model")


def test_health_follows_engine_readiness(engine, client):
    assert client.get("/health").status_code == 200
    engine.is_ready = False
    assert_openai_error(client.get("/health"), 503, contains="not ready")


def test_unknown_route_answers_in_openai_shape(client):
    assert_openai_error(client.get("/v1/nothing"), 404)


# -- completions
def test_completion_answer_and_what_the_engine_is_asked(engine, client):
    resp = client.post("/v1/completions", json={"model": MODEL, "prompt": "Say hi"})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-") and body["model"] == MODEL
    assert isinstance(body["created"], int)
    assert body["choices"] == [{"index": 0, "text": FULL_TEXT, "logprobs": None, "finish_reason": "length"}]
    assert body["usage"] == {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": len(PIECES),
                             "total_tokens": PROMPT_TOKENS + len(PIECES)}
    req = engine.requests[-1]
    assert (req.prompt, req.prompt_ids, req.add_special_tokens) == ("Say hi", None, True)
    # OpenAI's defaults: 16 tokens, temperature 1.0; nothing else set
    assert (req.max_tokens, req.temperature, req.top_p, req.seed, req.stop, req.ignore_eos) == (
        16, 1.0, None, None, (), False)


def test_completion_parameters_reach_the_engine(engine, client):
    resp = client.post("/v1/completions", json={
        "model": MODEL, "prompt": ["Say hi"], "max_tokens": 5, "temperature": 0, "top_p": 0.5, "seed": 7,
        "stop": ["\n", "END"], "ignore_eos": True, "stop_token_ids": [2, 3]})
    assert resp.status_code == 200, resp.text
    req = engine.requests[-1]
    assert (req.prompt, req.max_tokens, req.temperature, req.top_p, req.seed) == ("Say hi", 5, 0.0, 0.5, 7)
    assert (req.stop, req.ignore_eos, req.stop_token_ids) == (("\n", "END"), True, (2, 3))
    client.post("/v1/completions", json={"model": MODEL, "prompt": "x", "stop": "###"})
    assert engine.requests[-1].stop == ("###",)


@pytest.mark.parametrize("prompt", [[5, 6, 7], [[5, 6, 7]]])
def test_completion_token_id_prompt_goes_as_ids(engine, prompt):
    with make_client(engine, [served(text=ModelText(missing="no tokenizer here"))]) as client:  # ids need none
        resp = client.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "return_token_ids": True})
    assert resp.status_code == 200, resp.text
    assert (engine.requests[-1].prompt, engine.requests[-1].prompt_ids) == (None, [5, 6, 7])
    assert resp.json()["choices"][0]["token_ids"] == [100 + i for i in range(len(PIECES))]


def test_completion_stream_chunks_finish_and_done(engine, client):
    resp = client.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "stream": True})
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
    events = sse_payloads(resp.text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    # one chunk per token (also the token whose text is held back), finish_reason on the last only
    assert len(chunks) == len(PIECES)
    assert [c["choices"][0]["text"] for c in chunks] == list(PIECES)
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * (len(PIECES) - 1) + ["length"]
    assert {c["object"] for c in chunks} == {"text_completion"} and len({c["id"] for c in chunks}) == 1
    assert all("usage" not in c for c in chunks)  # no include_usage: no usage anywhere


def test_stream_include_usage_is_one_last_chunk_equal_to_the_whole_answer(client):
    whole = client.post("/v1/completions", json={"model": MODEL, "prompt": "hi"}).json()
    events = sse_payloads(client.post("/v1/completions", json={
        "model": MODEL, "prompt": "hi", "stream": True, "stream_options": {"include_usage": True}}).text)
    assert events[-1] == "[DONE]"
    with_usage = [e for e in events[:-1] if e.get("usage")]
    assert len(with_usage) == 1 and with_usage[0] is events[-2]
    assert with_usage[0]["choices"] == [] and with_usage[0]["usage"] == whole["usage"]
    assert all(e["usage"] is None for e in events[:-2])
    assert "".join(e["choices"][0]["text"] for e in events[:-2]) == whole["choices"][0]["text"]


# -- chat
def test_chat_renders_the_template_and_sends_it_without_special_tokens(engine, client):
    resp = client.post("/v1/chat/completions", json={**CHAT, "temperature": 0})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["choices"] == [{"index": 0, "message": {"role": "assistant", "content": FULL_TEXT},
                                "logprobs": None, "finish_reason": "length"}]
    req = engine.requests[-1]
    assert req.prompt == FakeTokenizer().apply_chat_template(CHAT["messages"], add_generation_prompt=True)
    assert req.add_special_tokens is False
    assert req.max_tokens is None  # default: the rest of the context
    assert req.temperature == 0


def test_chat_max_completion_tokens_wins_over_max_tokens(engine, client):
    client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 9})
    assert engine.requests[-1].max_tokens == 9
    client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 9, "max_completion_tokens": 3})
    assert engine.requests[-1].max_tokens == 3


def test_chat_text_parts_and_developer_role(engine, client):
    client.post("/v1/chat/completions", json={"model": MODEL, "messages": [
        {"role": "developer", "content": "rules"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]})
    assert engine.requests[-1].prompt == "<s><system>rules\n<user>a\nb\n<assistant>"


def test_chat_stream_role_first_content_finish_usage_done(client):
    events = sse_payloads(client.post("/v1/chat/completions", json={
        **CHAT, "stream": True, "stream_options": {"include_usage": True}}).text)
    assert events[-1] == "[DONE]"
    chunks, usage = events[:-2], events[-2]
    assert {c["object"] for c in chunks + [usage]} == {"chat.completion.chunk"}
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[0]["choices"][0]["finish_reason"] is None
    content = chunks[1:]
    # empty deltas (held-back text) are not sent; the finish_reason rides on the last content chunk
    assert [c["choices"][0]["delta"] for c in content] == [{"content": p} for p in PIECES if p]
    assert [c["choices"][0]["finish_reason"] for c in content][-1] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in content[:-1])
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == len(PIECES)


def test_chat_stream_finish_without_text_gets_its_own_chunk():
    engine = FakeEngine(pieces=("a", ""), finish="stop")
    with make_client(engine) as client:
        events = sse_payloads(client.post("/v1/chat/completions", json={**CHAT, "stream": True}).text)
    assert [(e["choices"][0]["delta"], e["choices"][0]["finish_reason"]) for e in events[:-1]] == [
        ({"role": "assistant", "content": ""}, None), ({"content": "a"}, None), ({}, "stop")]


def test_chat_without_template_is_400(engine):
    with make_client(engine, [served(text=ModelText(FakeTokenizer(chat_template=None)))]) as client:
        assert_openai_error(client.post("/v1/chat/completions", json=CHAT), 400, param="messages",
                            contains=NO_TEMPLATE)
        assert client.post("/v1/completions", json={"model": MODEL, "prompt": "hi"}).status_code == 200
    assert len(engine.requests) == 1


def test_repository_without_tokenizer_refuses_text_but_serves_ids(engine):
    with make_client(engine, [served(text=ModelText(missing="this model's repository has no tokenizer"))]) as c:
        assert c.get("/v1/models").status_code == 200
        assert_openai_error(c.post("/v1/chat/completions", json=CHAT), 400, contains="no tokenizer")
        assert_openai_error(c.post("/v1/completions", json={"model": MODEL, "prompt": "hi"}), 400, param="prompt",
                            contains="no tokenizer")
        assert c.post("/v1/completions", json={"model": MODEL, "prompt": [1, 2]}).status_code == 200
    assert len(engine.requests) == 1


# -- request errors
@pytest.mark.parametrize("body,param", [
    ({"prompt": "x", "temperature": "hot"}, "temperature"),
    ({"prompt": "x", "temperature": 2.5}, "temperature"),
    ({"prompt": "x", "temperature": -0.1}, "temperature"),
    ({"prompt": "x", "top_p": 0}, "top_p"),
    ({"prompt": "x", "top_p": 1.5}, "top_p"),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "x", "max_tokens": 2.0}, "max_tokens"),
    ({"prompt": "x", "max_tokens": "4"}, "max_tokens"),
    ({"prompt": "x", "n": 2}, "n"),
    ({"prompt": "x", "best_of": 3}, "best_of"),
    ({"prompt": "x", "logprobs": 2}, "logprobs"),
    ({"prompt": "x", "echo": True}, "echo"),
    ({"prompt": "x", "suffix": "y"}, "suffix"),
    ({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"prompt": "x", "stop": 5}, "stop"),
    ({"prompt": "x", "stop": [""]}, "stop"),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
    ({"prompt": "x", "stream": "yes"}, "stream"),
    ({"prompt": "x", "presence_penalty": 0.5}, "presence_penalty"),
    ({"prompt": "x", "logit_bias": {"5": 1.0}}, "logit_bias"),
    ({"prompt": ["a", "b"]}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": 5}, "prompt"),
    ({}, "prompt"),
    ({"prompt": "x", "model": 5}, "model"),
    # out of the int32 the generation model takes (2**32 + 3 wrapped to 3, 2**64 was a 500)
    ({"prompt": "x", "max_tokens": 2**32 + 3}, "max_tokens"),
    ({"prompt": "x", "max_tokens": 2**64}, "max_tokens"),
    ({"prompt": "a\ud800b"}, "prompt"),  # a lone surrogate (UnicodeEncodeError, a 500)
    ({"prompt": "x", "stop": ["ok", "\udfff"]}, "stop[1]"),
])
def test_bad_completion_requests_are_400_naming_the_field(engine, client, body, param):
    assert_openai_error(_post_json(client, "/v1/completions", {"model": MODEL, **body}), 400, param=param)
    assert engine.requests == []


@pytest.mark.parametrize("body,param", [
    ({"messages": []}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": [{"content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, "messages[0].content[0]"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ({"tool_choice": "auto"}, "tool_choice"),
    ({"logprobs": True}, "logprobs"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"n": 3}, "n"),
    ({"max_completion_tokens": 0}, "max_completion_tokens"),
    ({"stream": False, "stream_options": {"include_usage": True}}, "stream_options"),
    ({"max_completion_tokens": 2**32 + 3}, "max_completion_tokens"),
    ({"max_tokens": 2**64}, "max_tokens"),
    ({"messages": [{"role": "user", "content": "hi \ud83d"}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "\udc00"}]}]}, "messages[0].content[0].text"),
])
def test_bad_chat_requests_are_400_naming_the_field(engine, client, body, param):
    assert_openai_error(_post_json(client, "/v1/chat/completions", {**CHAT, **body}), 400, param=param)
    assert engine.requests == []


def test_malformed_bodies_are_400_not_422(client):
    for raw in (b"{not json", b"[1, 2]", b'"text"'):
        err = assert_openai_error(client.post("/v1/completions", content=raw,
                                              headers={"content-type": "application/json"}), 400)
        assert err["type"] == "invalid_request_error"


def test_unknown_model_is_404(engine, client):
    err = assert_openai_error(client.post("/v1/completions", json={"model": "gpt-9", "prompt": "x"}), 404,
                              param="model", contains="gpt-9")
    assert err["code"] == "model_not_found"
    assert_openai_error(client.post("/v1/chat/completions", json={**CHAT, "model": "gpt-9"}), 404)
    assert engine.requests == []


def test_model_may_be_omitted_only_with_one_model(engine):
    with make_client(engine) as client:
        assert client.post("/v1/completions", json={"prompt": "x"}).status_code == 200
    with make_client(engine, [served("a"), served("b")]) as client:
        assert_openai_error(client.post("/v1/completions", json={"prompt": "x"}), 400, param="model")
        assert client.post("/v1/completions", json={"model": "b", "prompt": "x"}).status_code == 200
    assert [r.model for r in engine.requests] == [MODEL, "b"]


def test_unknown_fields_are_accepted_and_logged(engine, client, caplog):
    with caplog.at_level(logging.WARNING, logger="wide_export.serving.openai"):
        resp = client.post("/v1/completions", json={"model": MODEL, "prompt": "x", "top_k": 5, "min_p": 0.1})
    assert resp.status_code == 200
    assert any("min_p" in r.getMessage() and "top_k" in r.getMessage() for r in caplog.records)


# -- engine errors
@pytest.mark.parametrize("kind,status", [("invalid", 400), ("unavailable", 503), ("internal", 500)])
@pytest.mark.parametrize("stream", [False, True])
def test_engine_errors_before_the_first_token_keep_their_status(kind, status, stream):
    engine = FakeEngine(fail=EngineError(kind, f"model says {kind}"))
    with make_client(engine) as client:
        resp = client.post("/v1/completions", json={"model": MODEL, "prompt": "x", "stream": stream})
    assert_openai_error(resp, status, contains=f"model says {kind}")


def test_engine_error_mid_stream_goes_in_the_stream_then_done():
    engine = FakeEngine(fail_after=2)
    with make_client(engine) as client:
        resp = client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert resp.status_code == 200
    events = sse_payloads(resp.text)
    assert events[-1] == "[DONE]"
    assert set(events[-2]) == {"error"} and "mid-generation" in events[-2]["error"]["message"]
    assert events[-2]["error"]["type"] == "server_error"
    assert [e["choices"][0]["delta"].get("content") for e in events[1:-2]] == ["Hel", "lo"]
