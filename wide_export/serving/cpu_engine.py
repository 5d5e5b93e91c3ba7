"""The OpenAI front door on the CPU generation path: `wide-export serve --model DIR --openai-port P` serves a
WIDE checkpoint through CpuGenerator (our decoder with the compiled CPU kernels), with no tritonserver.

`CpuEngine` is the frontend's Engine (wide_export.serving.openai.engine): requests run one at a time (the model's
one slot; the frontend's fair queue holds the others), each in a worker thread, one chunk per new token. A
client that goes away (the consumer closes the stream) stops its generation at the next token. Prompts come
as token ids or as text the folder's tokenizer encodes; the end tokens of the checkpoint, `stop_token_ids`
and `stop` strings end a generation with finish_reason "stop", the token budget with "length". Text and stops
follow the Triton generation model's rules (triton/textgen.RowOutput): text decoded incrementally over a few
tokens (a character split across tokens comes out whole, no decode of the whole answer per token), what may
still become a stop string held back, and neither a stop string nor the text of the end token that stopped
the row sent."""

from __future__ import annotations

import asyncio
import random
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import AsyncIterator

import numpy as np

from wide_export.serving.openai.engine import LENGTH, EngineError, GenerationChunk, GenerationRequest
from wide_export.generation.textgen import RowOutput

_DONE = object()


class CpuEngine:
    def __init__(self, generator, name: str):
        self.generator = generator  # cpu.generation.CpuGenerator
        self.name = name
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="wide-cpu-generate")

    def models(self) -> list[str]:
        return [self.name]

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def ready(self) -> bool:
        return True

    @property
    def max_model_len(self) -> int:
        return int(self.generator.model.config.max_position_embeddings)

    def _prompt(self, request: GenerationRequest) -> list[int]:
        if request.prompt_ids is not None:
            ids = [int(i) for i in request.prompt_ids]
        else:
            if self.generator.encode is None:
                raise EngineError("invalid", "this model has no tokenizer: send the prompt as token ids",
                                  "prompt")
            # a chat template's text already holds its BOS: sent with add_special_tokens false (as to Triton)
            ids = list(self.generator.encode(request.prompt or "", add_special_tokens=request.add_special_tokens))
        vocab = self.generator.model.config.vocab_size
        if not ids:
            raise EngineError("invalid", "the prompt is empty", "prompt")
        if any(not 0 <= i < vocab for i in ids):
            raise EngineError("invalid", f"a prompt token id is outside the vocabulary (0..{vocab - 1})", "prompt")
        return ids

    def _budget(self, request: GenerationRequest, prompt: int) -> int:
        room = self.max_model_len - prompt
        if room < 1:
            raise EngineError("invalid", f"the prompt ({prompt} tokens) fills the model's {self.max_model_len} "
                                         f"positions", "prompt")
        if request.max_tokens is None:
            return room
        if request.max_tokens > room:
            raise EngineError("invalid", f"max_tokens {request.max_tokens} + the prompt's {prompt} tokens exceed the "
                                         f"model's {self.max_model_len} positions", "max_tokens")
        return request.max_tokens

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        from wide_export.generation.torch_step import Sampling

        if request.model != self.name:
            raise EngineError("invalid", f"unknown model {request.model!r}", "model")
        # tokenizing (and the decoding below) on worker threads: an 850k-character prompt took 1.2 s to encode,
        # which on the event loop held /health and every stream (vLLM keeps them off its loop too)
        prompt = await asyncio.to_thread(self._prompt, request)
        budget = self._budget(request, len(prompt))
        seed = request.seed if request.seed is not None else random.randrange(2**63)  # no seed: a fresh draw
        sampling = Sampling(temperature=request.temperature or 0.0, top_p=1.0 if request.top_p is None
                            else request.top_p, seed=seed)
        ends = set(request.stop_token_ids) | (set() if request.ignore_eos else set(self.generator.eos))
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        halt = threading.Event()

        def put(item) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, item)

        row = RowOutput(np.asarray(prompt), budget, stop_ids=ends, stop_strings=tuple(request.stop),
                        codec=_Codec(self.generator.decode) if self.generator.decode is not None else None)

        def token(tok: int) -> None:  # on the worker thread: the row's stops and text (detokenizing) too
            row.add(tok)
            put(GenerationChunk(text=row.take_text(), token_ids=(tok,), finish_reason=row.finish_reason,
                                prompt_tokens=len(prompt), completion_tokens=len(row.tokens)))

        def work() -> None:
            try:
                self.generator.stream(prompt, budget, sampling, token, lambda tok: halt.is_set() or row.done)
            except BaseException as err:  # noqa: BLE001 - handed to the consumer
                put(err)
            finally:
                put(_DONE)

        done = loop.run_in_executor(self._pool, work)
        try:
            while True:
                item = await queue.get()
                if item is _DONE:  # the worker ended without a last token (cannot happen with budget >= 1)
                    yield GenerationChunk(finish_reason=LENGTH, prompt_tokens=len(prompt),
                                          completion_tokens=len(row.tokens))
                    break
                if isinstance(item, BaseException):
                    raise EngineError("internal", f"generation failed: {item}")
                yield item
                if item.finish_reason:
                    break
        finally:
            halt.set()
            await asyncio.shield(done)


class _Codec:
    """The generator's decode as the `codec` RowOutput takes (its `decode(ids)`)."""

    def __init__(self, decode):
        self.decode = decode
