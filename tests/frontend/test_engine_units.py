"""frontend/engine.py's small pieces against hand-written expectations: decoding, error mapping by what a
tritonclient error carries, the last chunk's finish reason and counts, readiness and closing."""

from __future__ import annotations

import asyncio

import grpc
import numpy as np
import pytest

from tests.frontend.test_engine import FakeClient, Result, rpc_error
from wide_export.frontend.engine import (
    GenerationChunk, GenerationRequest, TritonEngine, _scalar, _text, engine_error, model_info, parse_response,
)


def test_text_decoding():
    assert _text(None) == "" and _text(b"caf\xc3\xa9") == "café"
    assert _text(b"bad \xff byte") == "bad \ufffd byte"  # replaced, not raised
    assert _text(np.str_("x")) == "x" and _text(5) == "5"


def test_scalar_takes_the_first_element_of_any_shape():
    assert _scalar(Result(n=np.array([[3, 4]])), "n") == 3
    assert _scalar(Result(n=np.array([[[9]]])), "n") == 9
    assert _scalar(Result(n=np.array([])), "n") is None
    assert _scalar(Result(), "n") is None

    class Raising:
        def as_numpy(self, name):
            raise KeyError(name)

    assert _scalar(Raising(), "n") is None
    assert parse_response(Raising()) == GenerationChunk()


def test_parse_response_of_a_flat_or_nested_id_array():
    assert parse_response(Result(output_ids=np.array([[[5], [6]]]))).token_ids == (5, 6)
    assert parse_response(Result(text_output=np.array([b"\xff"], object))).text == "\ufffd"


class _Err(Exception):
    """A tritonclient InferenceServerException-like error: status() and message() methods."""

    def __init__(self, message, status=None):
        super().__init__(message)
        self._message, self._status = message, status

    def message(self):
        return self._message

    def status(self):
        return self._status


def test_engine_error_by_what_the_error_carries():
    err = engine_error(rpc_error(grpc.StatusCode.UNAVAILABLE, "server gone"))
    assert (err.kind, err.message) == ("unavailable", "server gone")
    err = engine_error(_Err("bad request", "StatusCode.INVALID_ARGUMENT"))
    assert (err.kind, err.message) == ("invalid", "bad request")
    err = engine_error(_Err("model gone", "NOT_FOUND"))
    assert (err.kind, err.message) == ("unavailable", "model gone")
    err = engine_error(_Err("", "StatusCode.INTERNAL"))
    assert (err.kind, err.message) == ("internal", "")  # no message: str(err), also empty
    err = engine_error(_Err("odd", "StatusCode.NO_SUCH_CODE"))
    assert (err.kind, err.message) == ("internal", "odd")
    err = engine_error(ValueError("plain"))  # no status(), no message()
    assert (err.kind, err.message) == ("internal", "plain")
    err = engine_error(ValueError("Request for unknown model: 'x' is not ready"))
    assert (err.kind, err.message) == ("unavailable", "Request for unknown model: 'x' is not ready")
    for sign in ("has no available versions", "is not healthy"):
        assert engine_error(_Err(f"model {sign}")).kind == "unavailable"

    class CodeOnly(Exception):  # has code() but is no grpc.RpcError: taken by its status()/message()
        def code(self):
            return grpc.StatusCode.INVALID_ARGUMENT

    err = engine_error(CodeOnly("not grpc"))
    assert (err.kind, err.message) == ("internal", "not grpc")

    class NoDetails(grpc.RpcError):
        def code(self):
            return grpc.StatusCode.INVALID_ARGUMENT

        def __str__(self):
            return "as text"

    err = engine_error(NoDetails())
    assert (err.kind, err.message) == ("invalid", "as text")


def test_message_attribute_that_is_not_a_method():
    class Attr(Exception):
        message = "an attribute"

    assert engine_error(Attr("the str")).message == "the str"


@pytest.mark.parametrize("chunk, kw, expected", [
    (GenerationChunk(text="a", token_ids=(1, 2), finish_reason="stop", prompt_tokens=4, completion_tokens=9), {},
     ("stop", 4, 9)),
    (GenerationChunk(token_ids=(1, 2)), {}, ("stop", None, 2)),  # counts from the chunk's own ids
    (GenerationChunk(token_ids=(1,)), {"tokens": 7}, ("stop", None, 7)),  # the stream's count wins
    (GenerationChunk(), {"tokens": 5, "max_tokens": 5}, ("length", None, 5)),  # the budget used up
    (GenerationChunk(), {"tokens": 6, "max_tokens": 5}, ("length", None, 6)),
    (GenerationChunk(), {"tokens": 4, "max_tokens": 5}, ("stop", None, 4)),
    (GenerationChunk(), {"tokens": 5, "max_tokens": 5, "default": "stop"}, ("stop", None, 5)),  # told: stop
    (GenerationChunk(finish_reason="length"), {"default": "stop"}, ("length", None, 0)),
    (GenerationChunk(), {"prompt_ids": [1, 2, 3]}, ("stop", 3, 0)),  # prompt count from the ids sent
    (GenerationChunk(prompt_tokens=8), {"prompt_ids": [1, 2, 3]}, ("stop", 8, 0)),
])
def test_the_last_chunk_by_hand(chunk, kw, expected):
    request = GenerationRequest(model="m", prompt_ids=kw.pop("prompt_ids", None), max_tokens=kw.pop("max_tokens", None))
    info = model_info("m", {})
    done = TritonEngine._complete(chunk, request, info, **kw)
    assert (done.finish_reason, done.prompt_tokens, done.completion_tokens) == expected
    assert (done.text, done.token_ids) == (chunk.text, chunk.token_ids)


class _ReadyClient(FakeClient):
    def __init__(self, answers):
        super().__init__()
        self.answers, self.asked, self.closed = list(answers), [], False

    async def is_model_ready(self, name, client_timeout=None):
        self.asked.append((name, client_timeout))
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    async def close(self):
        self.closed = True


def test_ready_asks_every_model_and_any_failure_is_not_ready():
    async def go(answers):
        client = _ReadyClient(answers)
        engine = TritonEngine("x", {"a": "a_t", "b": "b_t"}, timeout=2.5, client=client)
        return await engine.ready(), client.asked

    assert asyncio.run(go([True, True])) == (True, [("a_t", 2.5), ("b_t", 2.5)])
    assert asyncio.run(go([True, False])) == (False, [("a_t", 2.5), ("b_t", 2.5)])
    assert asyncio.run(go([False, True])) == (False, [("a_t", 2.5)])
    assert asyncio.run(go([ConnectionError("down")])) == (False, [("a_t", 2.5)])
    assert asyncio.run(TritonEngine("x", {"a": "a"}).ready()) is False  # not connected


def test_models_and_close():
    async def go():
        client = _ReadyClient([])
        engine = TritonEngine("x", {"a": "a_t", "b": "b_t"}, client=client)
        names = engine.models()
        await engine.close()
        again = await engine.ready()
        await engine.close()  # twice: nothing left to close
        return names, client.closed, again, engine._client

    assert asyncio.run(go()) == (["a", "b"], True, False, None)
