"""client.py on a fake tritonclient (no server): what GenerationClient builds and sends, exactly.

A fake `tritonclient.http` / `tritonclient.grpc` is put in sys.modules for each test; it records the
client's constructor arguments, each InferInput (name, shape, dtype, data), the requested outputs and
the infer() call, and answers with an array of its own, so the tests compare against values worked
out by hand."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from tests.triton import fake_tritonclient
from wide_export.base.errors import WideError
from wide_export.tritonserver.client import PROTOCOLS, GenerationClient

URL = "127.0.0.1:8123"


class FakeResult:
    def __init__(self, answer):
        self.answer = answer
        self.asked: list[str] = []

    def as_numpy(self, name):
        self.asked.append(name)
        return self.answer


def fake_module(name: str, answer=None):
    """A tritonclient.<name> stand-in; its clients land in module.clients."""
    module = types.ModuleType(f"tritonclient.{name}")
    module.clients = []
    module.answer = np.array([[7, 8, 9]], np.int64) if answer is None else answer

    class InferenceServerClient:
        def __init__(self, *args, **kwargs):
            self.args, self.kwargs = args, kwargs
            self.calls: list[tuple] = []
            self.results: list[FakeResult] = []
            self.server_ready, self.model_ready = True, True
            module.clients.append(self)

        def infer(self, *args, **kwargs):
            self.calls.append(("infer", args, kwargs))
            self.results.append(FakeResult(module.answer))
            return self.results[-1]

        def is_server_ready(self, *args, **kwargs):
            self.calls.append(("is_server_ready", args, kwargs))
            return self.server_ready

        def is_model_ready(self, *args, **kwargs):
            self.calls.append(("is_model_ready", args, kwargs))
            return self.model_ready

        def close(self, *args, **kwargs):
            self.calls.append(("close", args, kwargs))

    module.InferenceServerClient = InferenceServerClient
    module.InferInput = fake_tritonclient.InferInput
    module.InferRequestedOutput = fake_tritonclient.InferRequestedOutput
    return module


@pytest.fixture
def fakes(monkeypatch):
    """{"http": module, "grpc": module}, importable as tritonclient.http / tritonclient.grpc."""
    package = types.ModuleType("tritonclient")
    package.__path__ = []
    modules = {"http": fake_module("http"), "grpc": fake_module("grpc")}
    for name, module in modules.items():
        setattr(package, name, module)
        monkeypatch.setitem(sys.modules, f"tritonclient.{name}", module)
    monkeypatch.setitem(sys.modules, "tritonclient", package)
    return modules


def only_client(module):
    assert len(module.clients) == 1
    return module.clients[0]


def infer_call(client):
    calls = [c for c in client.calls if c[0] == "infer"]
    assert len(calls) == 1
    return calls[0][1], calls[0][2]


def test_protocols_and_an_unknown_one(fakes):
    assert PROTOCOLS == ("http", "grpc")
    for protocol in ("tcp", "HTTP", "", "grpcs"):
        with pytest.raises(WideError) as caught:
            GenerationClient(URL, protocol)
        assert caught.value.message.endswith(f" {protocol!r}") and "protocol" in caught.value.message
        assert "http" in caught.value.hint and "grpc" in caught.value.hint
    assert fakes["http"].clients == [] and fakes["grpc"].clients == []


def test_http_client_defaults(fakes):
    client = GenerationClient(URL)
    assert (client.protocol, client.model, client.timeout) == ("http", "wide_llm", 120.0)
    made = only_client(fakes["http"])
    assert made.args == (URL,)
    assert made.kwargs == {"connection_timeout": 120.0, "network_timeout": 120.0}
    assert client._client is made and client._module is fakes["http"]
    assert fakes["grpc"].clients == []


def test_http_client_passes_its_timeout_to_both_timeouts(fakes):
    client = GenerationClient(URL, "http", "m1", timeout=3.5)
    assert (client.protocol, client.model, client.timeout) == ("http", "m1", 3.5)
    made = only_client(fakes["http"])
    assert made.args == (URL,)
    assert made.kwargs == {"connection_timeout": 3.5, "network_timeout": 3.5}


def test_grpc_client_gets_only_the_url(fakes):
    client = GenerationClient(URL, protocol="grpc", model="m2", timeout=9.0)
    assert (client.protocol, client.model, client.timeout) == ("grpc", "m2", 9.0)
    made = only_client(fakes["grpc"])
    assert made.args == (URL,) and made.kwargs == {}
    assert client._module is fakes["grpc"]
    assert fakes["http"].clients == []


def test_http_raw_infer_sends_every_tensor_and_a_microsecond_timeout(fakes):
    client = GenerationClient(URL, "http", "my_model", timeout=2.5)
    a = np.arange(6, dtype=np.int64).reshape(2, 3)
    b = np.ones((2, 1), np.float32)
    out = client.raw_infer({"input_ids": (a, "INT64"), "temperature": (b, "FP32")})
    made = only_client(fakes["http"])
    args, kwargs = infer_call(made)
    assert out is fakes["http"].answer
    assert made.results[0].asked == ["output_ids"]
    assert args[0] == "my_model"
    tensors = args[1]
    assert [(t.name, t.shape, t.dtype) for t in tensors] == [("input_ids", [2, 3], "INT64"),
                                                            ("temperature", [2, 1], "FP32")]
    assert all(type(t.shape) is list for t in tensors)
    assert tensors[0].data is a and tensors[1].data is b
    assert set(kwargs) == {"outputs", "timeout"}
    assert [o.name for o in kwargs["outputs"]] == ["output_ids"]
    assert kwargs["timeout"] == 2_500_000 and type(kwargs["timeout"]) is int


def test_http_timeout_is_truncated_to_whole_microseconds(fakes):
    client = GenerationClient(URL, "http", timeout=0.0000015)
    client.raw_infer({"x": (np.zeros((1, 1), np.int64), "INT64")})
    _, kwargs = infer_call(only_client(fakes["http"]))
    assert kwargs["timeout"] == 1


def test_grpc_raw_infer_passes_a_client_timeout_in_seconds(fakes):
    client = GenerationClient(URL, "grpc", "g_model", timeout=4.25)
    a = np.zeros((1, 4), np.int64)
    out = client.raw_infer({"input_ids": (a, "INT64")})
    made = only_client(fakes["grpc"])
    args, kwargs = infer_call(made)
    assert out is fakes["grpc"].answer
    assert made.results[0].asked == ["output_ids"]
    assert args[0] == "g_model"
    assert [(t.name, t.shape, t.dtype, t.data is a) for t in args[1]] == [("input_ids", [1, 4], "INT64", True)]
    assert set(kwargs) == {"outputs", "client_timeout"}
    assert [o.name for o in kwargs["outputs"]] == ["output_ids"]
    assert kwargs["client_timeout"] == 4.25


def sent(module):
    args, _ = infer_call(only_client(module))
    return {t.name: t for t in args[1]}, [t.name for t in args[1]]


def test_generate_one_prompt_without_sampling(fakes):
    fakes["http"].answer = np.array([[11, 12, 13, 14]], np.int64)
    client = GenerationClient(URL)
    out = client.generate([5, 6, 7], 4)
    assert out.tolist() == [11, 12, 13, 14] and out.shape == (4,)
    tensors, order = sent(fakes["http"])
    assert order == ["input_ids", "max_new_tokens"]
    ids = tensors["input_ids"]
    assert (ids.shape, ids.dtype) == ([1, 3], "INT64")
    assert ids.data.dtype == np.int64 and ids.data.tolist() == [[5, 6, 7]]
    new = tensors["max_new_tokens"]
    assert (new.shape, new.dtype) == ([1, 1], "INT32")
    assert new.data.dtype == np.int32 and new.data.tolist() == [[4]]


def test_generate_a_batch_with_every_sampling_input(fakes):
    answer = np.array([[1, 2], [3, 4], [5, 6]], np.int64)
    fakes["grpc"].answer = answer
    client = GenerationClient(URL, "grpc")
    prompt = np.array([[1, 2], [3, 4], [5, 6]], np.int32)
    out = client.generate(prompt, 2, temperature=0.75, top_p=0.5, seed=1234)
    assert out is answer
    tensors, order = sent(fakes["grpc"])
    assert order == ["input_ids", "max_new_tokens", "temperature", "top_p", "seed"]
    expected = {"input_ids": ([3, 2], "INT64", np.int64, [[1, 2], [3, 4], [5, 6]]),
                "max_new_tokens": ([3, 1], "INT32", np.int32, [[2]] * 3),
                "temperature": ([3, 1], "FP32", np.float32, [[0.75]] * 3),
                "top_p": ([3, 1], "FP32", np.float32, [[0.5]] * 3),
                "seed": ([3, 1], "INT64", np.int64, [[1234]] * 3)}
    for name, (shape, dtype, np_dtype, values) in expected.items():
        tensor = tensors[name]
        assert (tensor.shape, tensor.dtype, tensor.data.dtype, tensor.data.tolist()) == (shape, dtype, np_dtype, values), name


def test_generate_sends_zero_valued_sampling_inputs(fakes):
    """0.0 and 0 are values (greedy, seed 0), not 'unset'."""
    client = GenerationClient(URL)
    out = client.generate(np.array([9], np.int64), 1, temperature=0.0, top_p=0.0, seed=0)
    assert out.tolist() == [7, 8, 9]  # the fake's one row
    tensors, order = sent(fakes["http"])
    assert order == ["input_ids", "max_new_tokens", "temperature", "top_p", "seed"]
    assert tensors["temperature"].data.tolist() == [[0.0]] and tensors["temperature"].dtype == "FP32"
    assert tensors["top_p"].data.tolist() == [[0.0]] and tensors["top_p"].dtype == "FP32"
    assert tensors["seed"].data.tolist() == [[0]] and tensors["seed"].dtype == "INT64"


@pytest.mark.parametrize("given", ["temperature", "top_p", "seed"])
def test_generate_sends_only_the_sampling_input_given(fakes, given):
    client = GenerationClient(URL)
    client.generate(np.array([[1, 2]], np.int64), 3, **{given: 1})
    tensors, order = sent(fakes["http"])
    assert order == ["input_ids", "max_new_tokens", given]
    assert tensors[given].data.tolist() == [[1]]


def test_generate_one_row_batch_keeps_its_batch_dimension(fakes):
    answer = np.array([[4, 5]], np.int64)
    fakes["http"].answer = answer
    client = GenerationClient(URL)
    out = client.generate(np.array([[1, 2, 3]], np.int64), 2)
    assert out is answer and out.shape == (1, 2)
    tensors, _ = sent(fakes["http"])
    assert tensors["input_ids"].shape == [1, 3]


@pytest.mark.parametrize("server, model, expected", [(True, True, True), (True, False, False),
                                                     (False, True, False), (False, False, False)])
def test_is_ready_needs_the_server_and_the_model(fakes, server, model, expected):
    client = GenerationClient(URL, "grpc", "ready_model")
    made = only_client(fakes["grpc"])
    made.server_ready, made.model_ready = server, model
    assert client.is_ready() is expected
    asked = [(name, args, kwargs) for name, args, kwargs in made.calls]
    if server:
        assert asked == [("is_server_ready", (), {}), ("is_model_ready", ("ready_model",), {})]
    else:
        assert asked == [("is_server_ready", (), {})]  # the model is not asked about


def test_is_ready_returns_a_bool_for_truthy_answers(fakes):
    client = GenerationClient(URL)
    made = only_client(fakes["http"])
    made.server_ready, made.model_ready = 1, "yes"
    assert client.is_ready() is True
    made.server_ready, made.model_ready = 2, 0
    assert client.is_ready() is False
    made.server_ready = []
    assert client.is_ready() is False


def test_close_and_context_manager(fakes):
    client = GenerationClient(URL)
    made = only_client(fakes["http"])
    client.close()
    assert made.calls == [("close", (), {})]
    made.calls.clear()
    with GenerationClient(URL, "grpc") as entered:
        grpc_made = only_client(fakes["grpc"])
        assert isinstance(entered, GenerationClient) and entered._client is grpc_made
        assert grpc_made.calls == []
    assert grpc_made.calls == [("close", (), {})]
    assert made.calls == []


def test_context_manager_closes_on_an_error_and_lets_it_through(fakes):
    client = GenerationClient(URL)
    made = only_client(fakes["http"])
    with pytest.raises(KeyError, match="boom"):
        with client as entered:
            assert entered is client
            raise KeyError("boom")
    assert made.calls == [("close", (), {})]
    assert client.__exit__(None, None, None) is None


def test_generate_sends_int64_seeds_and_fp32_sampling_whatever_their_type(fakes):
    """A seed drawn from numpy (np.int32, np.uint16) still goes as an INT64 tensor, a temperature given
    as np.float64 as FP32: the arrays match the dtypes declared to Triton."""
    client = GenerationClient(URL)
    client.generate(np.array([[3]], np.int64), 1, temperature=np.float64(0.5), top_p=np.float16(0.25),
                    seed=np.int32(7))
    tensors, _ = sent(fakes["http"])
    assert tensors["seed"].data.dtype == np.int64 and tensors["seed"].data.tolist() == [[7]]
    assert tensors["temperature"].data.dtype == np.float32 and tensors["top_p"].data.dtype == np.float32
    assert tensors["max_new_tokens"].data.dtype == np.int32
    fakes["http"].clients.clear()
    client = GenerationClient(URL)
    client.generate(np.array([[3]], np.int64), np.int64(2), seed=np.uint16(9))
    tensors, _ = sent(fakes["http"])
    assert tensors["seed"].data.dtype == np.int64 and tensors["seed"].data.tolist() == [[9]]
    assert tensors["max_new_tokens"].data.dtype == np.int32 and tensors["max_new_tokens"].data.tolist() == [[2]]
