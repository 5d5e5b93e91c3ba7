"""TritonEngine without a server: tensors per the model contract, response parsing, gRPC error mapping,
and the stream's life cycle (closed gracefully once finished, cancelled when the consumer leaves) on a
stand-in tritonclient.grpc.aio client."""

from __future__ import annotations

import asyncio

import grpc
import numpy as np
import pytest

from wide_export.serving.openai.engine import EngineError, GenerationRequest
from wide_export.serving.triton_engine import (
    ModelInfo, TritonEngine, engine_error, model_info, parse_response, request_tensors,
)

CONTRACT = {
    "name": "wide_llm", "max_batch_size": 8,
    "model_transaction_policy": {"decoupled": True},
    "input": [{"name": n, "dims": d} for n, d in [
        ("text_input", ["1"]), ("input_ids", ["-1"]), ("add_special_tokens", ["1"]), ("max_new_tokens", ["1"]),
        ("temperature", ["1"]), ("top_p", ["1"]), ("seed", ["1"]), ("stop_words", ["-1"]),
        ("stop_token_ids", ["-1"]), ("ignore_eos", ["1"])]],
    "output": [{"name": n} for n in ("output_ids", "text_output", "finish_reason", "num_input_tokens",
                                      "num_output_tokens")],
}


def info(decoupled=True, inputs=None) -> ModelInfo:
    cfg = dict(CONTRACT, model_transaction_policy={"decoupled": decoupled})
    if inputs is not None:
        cfg["input"] = [i for i in CONTRACT["input"] if i["name"] in inputs]
    return model_info("wide_llm", cfg)


def test_model_info_reads_the_config_json():
    got = info()
    assert got.decoupled and got.batched and "text_input" in got.inputs and "finish_reason" in got.outputs
    assert got.inputs["input_ids"] == [-1]
    assert not model_info("m", {"max_batch_size": 0}).decoupled
    assert not model_info("m", {"max_batch_size": 0}).batched


def test_request_tensors_follow_the_contract():
    req = GenerationRequest(model="wide_llm", prompt="héllo", add_special_tokens=False, max_tokens=5,
                            temperature=0.5, top_p=0.9, seed=7, stop=["\n", "END"], stop_token_ids=[2],
                            ignore_eos=True)
    tensors = {name: (array, dtype) for name, array, dtype in request_tensors(req, info())}
    assert set(tensors) == {"text_input", "add_special_tokens", "max_new_tokens", "temperature", "top_p", "seed",
                            "stop_words", "stop_token_ids", "ignore_eos"}
    expect = {"text_input": ("BYTES", (1, 1)), "add_special_tokens": ("BOOL", (1, 1)),
              "max_new_tokens": ("INT32", (1, 1)), "temperature": ("FP32", (1, 1)), "top_p": ("FP32", (1, 1)),
              "seed": ("INT64", (1, 1)), "stop_words": ("BYTES", (1, 2)), "stop_token_ids": ("INT64", (1, 1)),
              "ignore_eos": ("BOOL", (1, 1))}
    assert {k: (d, a.shape) for k, (a, d) in tensors.items()} == expect
    assert tensors["text_input"][0][0, 0] == "héllo".encode()
    assert list(tensors["stop_words"][0][0]) == [b"\n", b"END"]
    assert tensors["max_new_tokens"][0].dtype == np.int32
    assert tensors["add_special_tokens"][0].dtype == np.bool_ and not tensors["add_special_tokens"][0][0, 0]


def test_request_tensors_send_only_what_is_set():
    tensors = request_tensors(GenerationRequest(model="m", prompt_ids=[4, 5, 6]), info())
    assert [(n, a.shape, d) for n, a, d in tensors] == [("input_ids", (1, 3), "INT64")]
    assert tensors[0][1].tolist() == [[4, 5, 6]]


def test_a_parameter_the_model_cannot_take_is_refused_by_name():
    old = info(inputs={"input_ids", "max_new_tokens", "temperature", "top_p", "seed"})  # pre-text repositories
    with pytest.raises(EngineError) as err:
        request_tensors(GenerationRequest(model="m", prompt_ids=[1], stop=["x"]), old)
    assert (err.value.kind, err.value.param) == ("invalid", "stop")
    with pytest.raises(EngineError) as err:
        request_tensors(GenerationRequest(model="m", prompt="text"), old)
    assert err.value.param == "prompt"
    greedy_only = info(inputs={"input_ids", "max_new_tokens"})
    request_tensors(GenerationRequest(model="m", prompt_ids=[1], temperature=0.0, top_p=1.0), greedy_only)
    with pytest.raises(EngineError, match="temperature"):
        request_tensors(GenerationRequest(model="m", prompt_ids=[1], temperature=0.7), greedy_only)


class Result:
    """A stand-in InferResult."""

    def __init__(self, **outputs):
        self.outputs = outputs

    def as_numpy(self, name):
        return self.outputs.get(name)


def token(i: int, text: bytes, finish: bytes = b"", n: int = 1) -> Result:
    return Result(output_ids=np.array([[i]], np.int64), text_output=np.array([[text]], object),
                  finish_reason=np.array([[finish]], object), num_input_tokens=np.array([[3]], np.int32),
                  num_output_tokens=np.array([[n]], np.int32))


def test_parse_response():
    chunk = parse_response(token(42, "é".encode(), b"length", n=4))
    assert (chunk.text, chunk.token_ids, chunk.finish_reason, chunk.prompt_tokens, chunk.completion_tokens) == (
        "é", (42,), "length", 3, 4)
    assert parse_response(token(1, b"")).finish_reason is None
    bare = parse_response(Result(output_ids=np.array([[1, 2]], np.int64)))
    assert (bare.text, bare.token_ids, bare.finish_reason, bare.completion_tokens) == ("", (1, 2), None, None)


def rpc_error(code, details="why"):
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)


def test_grpc_status_maps_to_engine_error_kinds():
    from tritonclient.utils import InferenceServerException

    assert engine_error(rpc_error(grpc.StatusCode.INVALID_ARGUMENT, "too long")).kind == "invalid"
    assert engine_error(rpc_error(grpc.StatusCode.INVALID_ARGUMENT, "too long")).message == "too long"
    assert engine_error(rpc_error(grpc.StatusCode.UNAVAILABLE)).kind == "unavailable"
    assert engine_error(rpc_error(grpc.StatusCode.INTERNAL)).kind == "internal"
    unary = InferenceServerException("bad input", status="StatusCode.INVALID_ARGUMENT")
    assert (engine_error(unary).kind, engine_error(unary).message) == ("invalid", "bad input")
    assert engine_error(InferenceServerException("no status")).kind == "internal"
    # a model being reloaded: Triton reports it inside the stream, without a status
    unloaded = InferenceServerException("Request for unknown model: 'wide_llm' has no available versions")
    assert engine_error(unloaded).kind == "unavailable"
    assert engine_error(InferenceServerException("unknown model", status="StatusCode.NOT_FOUND")).kind == \
        "unavailable"


class FakeStream:
    """What tritonclient.grpc.aio's stream_infer returns: (result, error) pairs, cancel()."""

    def __init__(self, requests, script, headers):
        self.requests, self.script, self.headers = requests, list(script), headers
        self.sent: list = []
        self.cancelled = False
        self.half_closed = asyncio.Event()
        self._reader = asyncio.ensure_future(self._read())

    async def _read(self):
        async for item in self.requests:
            self.sent.append(item)
        self.half_closed.set()  # the client's side of the stream is done

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self.cancelled:
            raise asyncio.CancelledError()
        if self.script:
            item = self.script.pop(0)
            if isinstance(item, BaseException):
                raise item
            if item == "hang":
                await asyncio.sleep(3600)
            return item, None
        await self.half_closed.wait()  # like Triton: the stream ends once our side closed and all is sent
        raise StopAsyncIteration

    def cancel(self):
        self.cancelled = True
        self._reader.cancel()
        return True


class FakeClient:
    def __init__(self, script=(), config=CONTRACT, unary=None):
        self.script, self.config, self.unary = script, config, unary
        self.streams: list[FakeStream] = []
        self.infers: list = []

    async def get_model_config(self, name, as_json=False, client_timeout=None):
        return {"config": self.config}

    async def is_model_ready(self, name, client_timeout=None):
        return True

    def stream_infer(self, requests, headers=None):
        stream = FakeStream(requests, self.script, headers)
        self.streams.append(stream)
        return stream

    async def infer(self, name, inputs, outputs=None, request_id=""):
        self.infers.append((name, inputs, outputs))
        if isinstance(self.unary, BaseException):
            raise self.unary
        return self.unary

    async def close(self):
        pass


def run(coro):
    return asyncio.run(coro)


async def collect(engine, req):
    return [chunk async for chunk in engine.generate(req)]


def test_a_finished_stream_is_closed_gracefully_not_cancelled():
    client = FakeClient([token(7, b"a"), token(8, b"", n=2), token(9, b"b", b"stop", n=3)])

    async def go():
        engine = TritonEngine("x", {"served": "wide_llm"}, client=client)
        await engine.start()
        chunks = await collect(engine, GenerationRequest(model="served", prompt="hi", max_tokens=5))
        stream = client.streams[0]
        await asyncio.wait_for(stream.half_closed.wait(), 5)  # our side closed once the last token came
        await asyncio.sleep(0.05)
        return chunks, stream

    chunks, stream = run(go())
    assert [(c.text, c.token_ids, c.finish_reason) for c in chunks] == [
        ("a", (7,), None), ("", (8,), None), ("b", (9,), "stop")]
    assert chunks[-1].completion_tokens == 3 and chunks[-1].prompt_tokens == 3
    assert not stream.cancelled
    assert stream.headers == {"triton_grpc_error": "true"}
    sent = stream.sent[0]
    assert sent["model_name"] == "wide_llm" and [i.name() for i in sent["inputs"]] == [
        "text_input", "add_special_tokens", "max_new_tokens"]
    assert [o.name() for o in sent["outputs"]] == ["output_ids", "text_output", "finish_reason",
                                                   "num_input_tokens", "num_output_tokens"]


def test_a_consumer_leaving_cancels_the_stream():
    client = FakeClient([token(7, b"a"), "hang"])

    async def go():
        engine = TritonEngine("x", {"m": "wide_llm"}, client=client)
        await engine.start()
        gen = engine.generate(GenerationRequest(model="m", prompt="hi"))
        first = await gen.__anext__()
        task = asyncio.ensure_future(gen.__anext__())
        await asyncio.sleep(0.05)
        task.cancel()  # the HTTP client went away while we waited for the next token
        with pytest.raises(asyncio.CancelledError):
            await task
        await gen.aclose()
        return first

    assert run(go()).text == "a"
    assert client.streams[0].cancelled


def test_closing_the_generation_between_tokens_cancels_the_stream_at_once():
    client = FakeClient([token(7, b"a"), token(8, b"b"), "hang"])

    async def go():
        engine = TritonEngine("x", {"m": "wide_llm"}, client=client)
        await engine.start()
        gen = engine.generate(GenerationRequest(model="m", prompt="hi"))
        await gen.__anext__()
        await gen.aclose()  # the SSE body was cancelled while it was sending the first chunk
        return client.streams[0].cancelled  # now, not when the garbage collector gets to it

    assert run(go())


def test_a_stream_error_keeps_its_grpc_status_and_is_not_cancelled():
    client = FakeClient([rpc_error(grpc.StatusCode.INVALID_ARGUMENT, "prompt too long")])

    async def go():
        engine = TritonEngine("x", {"m": "wide_llm"}, client=client)
        await engine.start()
        with pytest.raises(EngineError) as err:
            await collect(engine, GenerationRequest(model="m", prompt="hi"))
        return err.value

    err = run(go())
    assert (err.kind, err.message) == ("invalid", "prompt too long")
    assert not client.streams[0].cancelled


def test_an_error_inside_the_stream_closes_it_without_cancelling():
    from tritonclient.utils import InferenceServerException

    class ErrorStream(FakeStream):
        async def __anext__(self):
            if self.script:
                return None, self.script.pop(0)
            await self.half_closed.wait()
            raise StopAsyncIteration

    client = FakeClient([InferenceServerException("Request for unknown model: 'wide_llm' is not found")])
    client.stream_infer = lambda requests, headers=None: client.streams.append(
        ErrorStream(requests, client.script, headers)) or client.streams[-1]

    async def go():
        engine = TritonEngine("x", {"m": "wide_llm"}, client=client)
        await engine.start()
        with pytest.raises(EngineError) as err:
            await collect(engine, GenerationRequest(model="m", prompt="hi"))
        await asyncio.wait_for(client.streams[0].half_closed.wait(), 5)
        await asyncio.sleep(0.05)
        return err.value

    assert run(go()).kind == "unavailable"
    assert not client.streams[0].cancelled


def test_a_non_decoupled_model_gets_one_infer_call():
    whole = Result(output_ids=np.array([[5, 6]], np.int64), text_output=np.array([[b"hey"]], object),
                   finish_reason=np.array([[b"length"]], object), num_input_tokens=np.array([[2]], np.int32),
                   num_output_tokens=np.array([[2]], np.int32))
    client = FakeClient(config=dict(CONTRACT, model_transaction_policy={}), unary=whole)

    async def go():
        engine = TritonEngine("x", {"m": "wide_llm"}, client=client)
        await engine.start()
        return await collect(engine, GenerationRequest(model="m", prompt_ids=[1, 2], max_tokens=2))

    chunks = run(go())
    assert [(c.text, c.token_ids, c.finish_reason, c.completion_tokens) for c in chunks] == [
        ("hey", (5, 6), "length", 2)]
    assert client.streams == [] and len(client.infers) == 1


def test_a_model_without_finish_reason_gets_one_from_the_budget():
    old = dict(CONTRACT, output=[{"name": "output_ids"}])
    client = FakeClient([Result(output_ids=np.array([[i]], np.int64)) for i in range(3)], config=old)

    async def go():
        engine = TritonEngine("x", {"m": "wide_llm"}, client=client)
        await engine.start()
        return await collect(engine, GenerationRequest(model="m", prompt_ids=[1, 2], max_tokens=3))

    chunks = run(go())
    assert [c.finish_reason for c in chunks] == [None, None, "length"]
    assert (chunks[-1].prompt_tokens, chunks[-1].completion_tokens) == (2, 3)
