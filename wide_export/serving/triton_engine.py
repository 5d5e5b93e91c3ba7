"""The OpenAI front door's `Engine` on tritonserver (serving/openai/engine.py has the protocol).

`TritonEngine` talks to a running tritonserver over gRPC (`tritonclient.grpc.aio`):
a decoupled (streaming) model gets one bidirectional stream per request
(`stream_infer`, one response per new token), any other model one `infer` call. The
inputs it sends are those of the generation model's contract (docs/triton.md,
"OpenAI-compatible API"): the prompt as `text_input` or `input_ids`, and only the
optional tensors the request sets. A parameter the model's config has no input for
is refused (400) rather than dropped.

Streams are opened with the `triton_grpc_error: true` header, so an error closes the
stream with its real gRPC status (INVALID_ARGUMENT -> 400, UNAVAILABLE -> 503, others
500); without it Triton reports stream errors as bare messages. A stream is closed
without cancelling once its last response is in (cancelling a stream after Triton
rejected a request can keep tritonserver from exiting, see docs/triton.md); it is
cancelled when the consumer stops early (client disconnect), which cancels the
request in Triton (the model sees `is_cancelled()` at its next token).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, AsyncIterator, Mapping, Optional

from wide_export.serving.openai.engine import LENGTH, STOP, EngineError, GenerationChunk, GenerationRequest
from wide_export.tritonserver import contract as C

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger("wide_export.serving.openai")

# Triton core's messages for a model that cannot take requests now (stream errors have no status).
_UNAVAILABLE_SIGNS = ("Request for unknown model", "has no available versions", "is not ready", "is not healthy")
_DRAIN_TIMEOUT = 30.0  # seconds a finished stream may take to close before it is cancelled


@dataclass
class ModelInfo:
    """What the engine needs to know of a Triton model (from its config)."""

    name: str
    decoupled: bool
    inputs: dict[str, list[int]]  # name -> dims (without the batch dim)
    outputs: set[str]
    batched: bool  # max_batch_size > 0: every tensor has a leading batch dim


def model_info(name: str, config: Mapping) -> ModelInfo:
    """ModelInfo from `get_model_config(..., as_json=True)["config"]`."""
    policy = config.get("model_transaction_policy") or {}
    return ModelInfo(
        name=name,
        decoupled=bool(policy.get("decoupled", False)),
        inputs={i["name"]: [int(d) for d in i.get("dims", [])] for i in config.get("input", [])},
        outputs={o["name"] for o in config.get("output", [])},
        batched=int(config.get("max_batch_size", 0) or 0) > 0,
    )


_FP32_TINY = 1e-45  # rounds to the smallest positive float32 (a subnormal, 1.4e-45)


def request_tensors(req: GenerationRequest, info: ModelInfo) -> list[tuple[str, "np.ndarray", str]]:
    """(name, array, triton dtype) of the inputs for `req`, shaped for `info` (batch dim of 1 when batched).

    EngineError('invalid') naming the parameter when the model has no input for it.
    """
    import numpy as np

    tensors: list[tuple[str, np.ndarray, str]] = []

    def add(name: str, values: list, param: str) -> None:
        dtype = C.client_dtype(name)
        if name not in info.inputs:
            raise EngineError("invalid", f"model {info.name} does not take {param} (it has no input {name!r})",
                              param=param)
        if dtype == "BYTES":
            array = np.array(values, dtype=np.object_)
        else:
            array = np.array(values, dtype={"INT64": np.int64, "INT32": np.int32, "FP32": np.float32,
                                            "BOOL": np.bool_}[dtype])
        tensors.append((name, array[None, :] if info.batched else array, dtype))

    if req.prompt_ids is not None:
        add(C.INPUT_IDS, [int(t) for t in req.prompt_ids], "prompt")
    else:
        add(C.TEXT_INPUT, [(req.prompt or "").encode("utf-8")], "prompt")
        if C.ADD_SPECIAL_TOKENS in info.inputs:
            add(C.ADD_SPECIAL_TOKENS, [bool(req.add_special_tokens)], "add_special_tokens")
    if req.max_tokens is not None:
        add(C.MAX_NEW_TOKENS, [int(req.max_tokens)], "max_tokens")
    if req.temperature is not None and (req.temperature > 0 or C.TEMPERATURE in info.inputs):
        add(C.TEMPERATURE, [float(req.temperature)], "temperature")
    if req.top_p is not None and (req.top_p < 1 or C.TOP_P in info.inputs):
        # a positive top_p stays positive in FP32 (1e-300 would round to 0, which the model refuses): raised to
        # the smallest float32 it keeps the most likely token alone, as it would have
        add(C.TOP_P, [max(float(req.top_p), _FP32_TINY) if req.top_p > 0 else float(req.top_p)], "top_p")
    if req.seed is not None:
        add(C.SEED, [int(req.seed)], "seed")
    if req.stop:
        add(C.STOP_WORDS, [s.encode("utf-8") for s in req.stop], "stop")
    if req.stop_token_ids:
        add(C.STOP_TOKEN_IDS, [int(t) for t in req.stop_token_ids], "stop_token_ids")
    if req.ignore_eos:
        add(C.IGNORE_EOS, [True], "ignore_eos")
    return tensors


def _scalar(result, name: str):
    """The first element of output `name`, or None when the response does not carry it."""
    try:
        array = result.as_numpy(name)
    except Exception:  # noqa: BLE001 - tritonclient raises on a missing output in some versions
        return None
    if array is None or array.size == 0:
        return None
    return array.reshape(-1)[0]


def _text(value) -> str:
    if value is None:
        return ""
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def parse_response(result) -> GenerationChunk:
    """A chunk from one InferResult (decoupled: one token; otherwise the whole generation)."""
    ids = None
    try:
        ids = result.as_numpy(C.OUTPUT_IDS)
    except Exception:  # noqa: BLE001
        ids = None
    token_ids = tuple(int(t) for t in ids.reshape(-1)) if ids is not None else ()
    finish = _text(_scalar(result, C.FINISH_REASON)) or None
    prompt_tokens = _scalar(result, C.NUM_INPUT_TOKENS)
    completion_tokens = _scalar(result, C.NUM_OUTPUT_TOKENS)
    return GenerationChunk(
        text=_text(_scalar(result, C.TEXT_OUTPUT)), token_ids=token_ids, finish_reason=finish,
        prompt_tokens=None if prompt_tokens is None else int(prompt_tokens),
        completion_tokens=None if completion_tokens is None else int(completion_tokens),
    )


def engine_error(err: BaseException) -> EngineError:
    """EngineError of a tritonclient / gRPC error, by its gRPC status."""
    import grpc

    code = None
    if isinstance(err, grpc.RpcError) and hasattr(err, "code"):
        code = err.code()
        message = err.details() if hasattr(err, "details") else str(err)
    else:
        status = getattr(err, "status", lambda: None)()
        message = getattr(err, "message", lambda: str(err))() if callable(getattr(err, "message", None)) \
            else str(err)
        if status:
            code = getattr(grpc.StatusCode, str(status).replace("StatusCode.", ""), None)
    message = message or str(err)
    if code is None and any(sign in message for sign in _UNAVAILABLE_SIGNS):
        # Errors Triton sends inside a stream carry no status even with triton_grpc_error (e.g. a
        # model being reloaded: "Request for unknown model: 'x' has no available versions").
        return EngineError("unavailable", message)
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return EngineError("invalid", message)
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.NOT_FOUND):
        return EngineError("unavailable", message)
    return EngineError("internal", message)


class TritonEngine:
    """Engine on a running tritonserver, over gRPC. `models`: served name -> Triton model name."""

    def __init__(self, url: str, models: Mapping[str, str], timeout: float = 10.0, client=None):
        self.url = url
        self.where = f"tritonserver at {url}"  # what the frontend's start-up error names
        self._names = dict(models)
        self._timeout = timeout
        self._client = client  # a tritonclient.grpc.aio client; made in start() when not given
        self._info: dict[str, ModelInfo] = {}
        self._drains: set[asyncio.Task] = set()

    def models(self) -> list[str]:
        return list(self._names)

    async def start(self) -> None:
        if self._client is None:
            import tritonclient.grpc.aio as grpcclient

            self._client = grpcclient.InferenceServerClient(self.url)
        for served in self._names:
            await self._model(served)  # fail early when a model is missing or not loaded

    async def close(self) -> None:
        for task in list(self._drains):
            task.cancel()
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def ready(self) -> bool:
        if self._client is None:
            return False
        try:
            for name in self._names.values():
                if not await self._client.is_model_ready(name, client_timeout=self._timeout):
                    return False
            return True
        except Exception:  # noqa: BLE001 - any failure to answer means not ready
            return False

    async def _model(self, served: str) -> ModelInfo:
        info = self._info.get(served)
        if info is None:
            name = self._names[served]
            try:
                config = await self._client.get_model_config(name, as_json=True, client_timeout=self._timeout)
            except Exception as err:  # noqa: BLE001
                raise engine_error(err) from None
            info = self._info[served] = model_info(name, config.get("config", config))
        return info

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        import tritonclient.grpc.aio as grpcclient

        if self._client is None:
            raise EngineError("unavailable", "the engine is not connected to tritonserver")
        info = await self._model(request.model)
        inputs = []
        for name, array, dtype in request_tensors(request, info):
            tensor = grpcclient.InferInput(name, list(array.shape), dtype)
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        outputs = [grpcclient.InferRequestedOutput(name) for name in C.OUTPUT_NAMES if name in info.outputs]
        if info.decoupled:
            # aclosing: when our consumer closes us early, the stream is cancelled now, not at GC
            async with contextlib.aclosing(self._stream(info, inputs, outputs, request)) as chunks:
                async for chunk in chunks:
                    yield chunk
        else:
            try:
                result = await self._client.infer(info.name, inputs, outputs=outputs, request_id=request.request_id)
            except Exception as err:  # noqa: BLE001 - tritonclient wraps gRPC errors
                raise engine_error(err) from None
            yield self._complete(parse_response(result), request, info)

    async def _stream(self, info: ModelInfo, inputs, outputs, request: GenerationRequest
                      ) -> AsyncIterator[GenerationChunk]:
        done = asyncio.Event()

        async def requests():
            yield {"model_name": info.name, "inputs": inputs, "outputs": outputs, "request_id": request.request_id}
            await done.wait()  # keep our side open until the last response is in; then close it gracefully

        responses = self._client.stream_infer(requests(), headers={"triton_grpc_error": "true"})
        finished = False
        tokens = 0
        try:
            while True:
                try:
                    result, error = await responses.__anext__()
                except StopAsyncIteration:
                    break
                except Exception as err:  # noqa: BLE001 - grpc.aio raises the stream's status here
                    finished = True  # the server ended the stream: nothing to cancel
                    raise engine_error(err) from None
                if error is not None:
                    # Triton rejected the request (an error without a status): close our side and let the
                    # stream end, never cancel it (a cancelled stream after a rejection keeps tritonserver
                    # from exiting until its exit timeout, docs/triton.md).
                    finished = True
                    done.set()
                    self._drain(responses)
                    raise engine_error(error)
                chunk = parse_response(result)
                tokens += len(chunk.token_ids)
                if chunk.finish_reason is None and C.FINISH_REASON not in info.outputs and request.max_tokens \
                        and tokens >= request.max_tokens:
                    chunk = GenerationChunk(chunk.text, chunk.token_ids, LENGTH, chunk.prompt_tokens,
                                            chunk.completion_tokens)
                if chunk.finish_reason is not None:
                    finished = True
                    done.set()
                    self._drain(responses)
                    yield self._complete(chunk, request, info, tokens)
                    return
                yield chunk
            finished = True
            # The stream ended without a finish_reason (a model without that output): it ran to its end.
            yield self._complete(GenerationChunk(), request, info, tokens, default=STOP)
        finally:
            done.set()
            if not finished:
                responses.cancel()  # the consumer went away: cancel the request in Triton

    def _drain(self, responses) -> None:
        """Read the stream to its end in the background (the model's final flag closes it)."""

        async def drain():
            try:
                await asyncio.wait_for(self._read_all(responses), _DRAIN_TIMEOUT)
            except asyncio.TimeoutError:
                log.warning("a finished gRPC stream did not close in %.0f s; cancelling it", _DRAIN_TIMEOUT)
                responses.cancel()
            except Exception:  # noqa: BLE001 - the request is complete; errors after it do not matter
                pass

        task = asyncio.ensure_future(drain())
        self._drains.add(task)
        task.add_done_callback(self._drains.discard)

    @staticmethod
    async def _read_all(responses) -> None:
        while True:
            try:
                await responses.__anext__()
            except StopAsyncIteration:
                return

    @staticmethod
    def _complete(chunk: GenerationChunk, request: GenerationRequest, info: ModelInfo, tokens: Optional[int] = None,
                  default: Optional[str] = None) -> GenerationChunk:
        """The last chunk, with a finish_reason and counts even from a model that reports neither."""
        completion = chunk.completion_tokens
        if completion is None:
            completion = tokens if tokens is not None else len(chunk.token_ids)
        prompt = chunk.prompt_tokens
        if prompt is None and request.prompt_ids is not None:
            prompt = len(request.prompt_ids)
        finish = chunk.finish_reason or default
        if finish is None:
            finish = LENGTH if request.max_tokens is not None and completion >= request.max_tokens else STOP
        return GenerationChunk(chunk.text, chunk.token_ids, finish, prompt, completion)
