"""serving/openai/engine.py's small pieces against hand-written expectations: decoding, error mapping by what a
tritonclient error carries, the last chunk's finish reason and counts, readiness and closing."""

from __future__ import annotations

import asyncio

import grpc
import numpy as np
import pytest

from tests.frontend.test_engine import FakeClient, Result, rpc_error
from wide_export.serving.openai.engine import GenerationChunk, GenerationRequest
from wide_export.serving.triton_engine import TritonEngine, _scalar, _text, engine_error, model_info, parse_response


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


# -- the request's tensors
from tests.frontend.test_engine import CONTRACT, info  # noqa: E402
from wide_export.serving.openai.engine import EngineError  # noqa: E402
from wide_export.serving.triton_engine import request_tensors  # noqa: E402

FULL = dict(prompt_ids=[1], max_tokens=3, temperature=0.5, top_p=0.5, seed=1, stop=["x"], stop_token_ids=[2],
            ignore_eos=True)


@pytest.mark.parametrize("field, tensor, param", [
    ("prompt_ids", "input_ids", "prompt"), ("max_tokens", "max_new_tokens", "max_tokens"),
    ("temperature", "temperature", "temperature"), ("top_p", "top_p", "top_p"), ("seed", "seed", "seed"),
    ("stop", "stop_words", "stop"), ("stop_token_ids", "stop_token_ids", "stop_token_ids"),
    ("ignore_eos", "ignore_eos", "ignore_eos")])
def test_each_parameter_without_its_input_is_refused_by_name(field, tensor, param):
    lacking = info(inputs={i["name"] for i in CONTRACT["input"]} - {tensor})
    with pytest.raises(EngineError) as err:
        request_tensors(GenerationRequest(model="m", **FULL), lacking)
    assert (err.value.kind, err.value.param) == ("invalid", param)
    assert "wide_llm" in err.value.message and f" {param} " in err.value.message
    assert err.value.message.endswith(f"input {tensor!r})")


def test_add_special_tokens_without_its_input_is_refused_by_name():
    lacking = info(inputs={"text_input", "max_new_tokens"})
    tensors = request_tensors(GenerationRequest(model="m", prompt="x"), lacking)  # not sent: not asked
    assert [n for n, _, _ in tensors] == ["text_input"]
    both = info(inputs={"text_input", "add_special_tokens"})
    values = {n: a for n, a, _ in request_tensors(GenerationRequest(model="m", prompt=None), both)}
    assert values["text_input"].tolist() == [[b""]] and values["add_special_tokens"].tolist() == [[True]]


def test_tensor_values_by_hand():
    values = {n: (a, d) for n, a, d in request_tensors(GenerationRequest(model="m", **FULL), info())}
    assert values["input_ids"][0].dtype == np.int64 and values["input_ids"][0].tolist() == [[1]]
    assert values["ignore_eos"][0].tolist() == [[True]] and values["ignore_eos"][0].dtype == np.bool_
    assert values["temperature"][0].dtype == np.float32 and values["seed"][0].dtype == np.int64
    assert values["stop_token_ids"][0].dtype == np.int64 and values["stop_words"][0].dtype == object
    unbatched = model_info("m", {**CONTRACT, "max_batch_size": 0})
    flat = {n: a for n, a, _ in request_tensors(GenerationRequest(model="m", **FULL), unbatched)}
    assert flat["input_ids"].shape == (1,) and flat["stop_words"].tolist() == [b"x"]


def test_top_p_of_one_and_greedy_temperature_need_no_input():
    only_ids = model_info("m", {"input": [{"name": "input_ids", "dims": [-1]}], "max_batch_size": 1})
    tensors = request_tensors(GenerationRequest(model="m", prompt_ids=[1], temperature=0.0, top_p=1.0), only_ids)
    assert [n for n, _, _ in tensors] == ["input_ids"]
    with pytest.raises(EngineError, match="top_p"):
        request_tensors(GenerationRequest(model="m", prompt_ids=[1], top_p=0.99), only_ids)
    with_both = model_info("m", {"input": [{"name": n, "dims": [1]} for n in ("input_ids", "temperature", "top_p")]})
    sent = [n for n, _, _ in request_tensors(GenerationRequest(model="m", prompt_ids=[1], temperature=0.0,
                                                               top_p=1.0), with_both)]
    assert sent == ["input_ids", "temperature", "top_p"]  # the model takes them: sent as asked


def test_a_tiny_top_p_reaches_the_model_positive_and_keeps_the_most_likely_token():
    """top_p 1e-300 (the API takes any top_p > 0) was 0 in the FP32 tensor, which the model refuses as outside
    (0, 1]: it goes as the smallest positive float32, and the repository's rows.py keeps the argmax alone."""
    from types import SimpleNamespace

    from wide_export.generation import rows

    info = model_info("m", {"input": [{"name": n, "dims": [1]} for n in ("input_ids", "temperature", "top_p")]})
    for top_p in (1e-300, 1e-46):
        sent = dict((n, a) for n, a, _ in request_tensors(GenerationRequest(model="m", prompt_ids=[1], temperature=1.0,
                                                                            top_p=top_p), info))
        assert sent["top_p"].dtype == np.float32 and 0 < float(sent["top_p"][0]) < 1e-44
        row = rows.Row(np.array([1]), 1, temperature=float(sent["temperature"][0]), top_p=float(sent["top_p"][0]))
        rows.validate_row(row, SimpleNamespace(max_total_tokens=8, max_prompt_tokens=0, vocab_size=4))
        logits = np.array([[0.1, 2.0, 1.9, -1.0]], np.float32)
        assert {int(rows.choose_tokens(logits, [row], [np.random.default_rng(s)])[0]) for s in range(30)} == {1}


def test_model_info_defaults():
    bare = model_info("m", {"input": [{"name": "x"}], "output": [{"name": "y"}]})
    assert (bare.decoupled, bare.batched, bare.inputs, bare.outputs) == (False, False, {"x": []}, {"y"})
    assert model_info("m", {"max_batch_size": 1}).batched is True
    assert model_info("m", {"max_batch_size": None}).batched is False
    assert model_info("m", {"model_transaction_policy": None}).decoupled is False


class _ConfigClient(FakeClient):
    def __init__(self, config, error=None):
        super().__init__(config=config)
        self.error, self.asked = error, []

    async def get_model_config(self, name, as_json=False, client_timeout=None):
        self.asked.append((name, as_json, client_timeout))
        if self.error is not None:
            raise self.error
        return self.config


def test_model_config_is_asked_once_as_json_with_the_timeout():
    async def go():
        client = _ConfigClient({"config": {"max_batch_size": 2, "input": [{"name": "input_ids", "dims": [-1]}]}})
        engine = TritonEngine("x", {"served": "triton_name"}, timeout=1.5, client=client)
        await engine.start()
        first = await engine._model("served")
        second = await engine._model("served")
        return client.asked, first, second

    asked, first, second = asyncio.run(go())
    assert asked == [("triton_name", True, 1.5)] and first is second and first.batched and first.name == "triton_name"


def test_a_config_without_the_config_key_is_the_config_itself():
    async def go():
        engine = TritonEngine("x", {"s": "t"}, client=_ConfigClient({"max_batch_size": 4}))
        return await engine._model("s")

    assert asyncio.run(go()).batched is True


def test_a_failing_config_request_is_an_engine_error():
    async def go():
        engine = TritonEngine("x", {"s": "t"}, client=_ConfigClient({}, error=rpc_error(grpc.StatusCode.UNAVAILABLE,
                                                                                       "no server")))
        await engine.start()

    with pytest.raises(EngineError) as err:
        asyncio.run(go())
    assert (err.value.kind, err.value.message) == ("unavailable", "no server")
