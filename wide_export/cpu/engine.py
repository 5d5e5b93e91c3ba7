"""The OpenAI front door on the CPU generation path: `wide-export serve --model DIR --openai-port P` serves a
WIDE checkpoint through CpuGenerator (our decoder with the compiled CPU kernels), with no tritonserver.

`CpuEngine` is the frontend's Engine (wide_export.frontend.engine): requests run one at a time (the model's
one slot; the frontend's fair queue holds the others), each in a worker thread, one chunk per new token. A
client that goes away (the consumer closes the stream) stops its generation at the next token. Prompts come
as token ids or as text the folder's tokenizer encodes; the end tokens of the checkpoint, `stop_token_ids`
and `stop` strings end a generation with finish_reason "stop", the token budget with "length"."""

from __future__ import annotations

import asyncio
import random
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import AsyncIterator, Optional

from wide_export.frontend.engine import LENGTH, STOP, EngineError, GenerationChunk, GenerationRequest

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
            ids = list(self.generator.encode(request.prompt or ""))
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
        from wide_export.model.generate import Sampling

        if request.model != self.name:
            raise EngineError("invalid", f"unknown model {request.model!r}", "model")
        prompt = self._prompt(request)
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

        def work() -> None:
            try:
                self.generator.stream(prompt, budget, sampling, lambda tok: put(tok),
                                      lambda tok: halt.is_set() or tok in ends)
            except BaseException as err:  # noqa: BLE001 - handed to the consumer
                put(err)
            finally:
                put(_DONE)

        done = loop.run_in_executor(self._pool, work)
        new: list[int] = []
        sent = ""
        finished = False
        try:
            while True:
                item = await queue.get()
                if item is _DONE:
                    break
                if isinstance(item, BaseException):
                    raise EngineError("internal", f"generation failed: {item}")
                new.append(item)
                reason = STOP if item in ends else (LENGTH if len(new) >= budget else None)
                text = self._text(new, reason is not None)
                cut = _first_stop(text, request.stop, len(sent))
                if cut is not None:
                    text, reason = text[:cut], STOP
                chunk = GenerationChunk(text=text[len(sent):], token_ids=(item,), finish_reason=reason,
                                        prompt_tokens=len(prompt), completion_tokens=len(new))
                sent = text
                yield chunk
                if reason is not None:
                    finished = True
                    break
            if not finished:  # the worker ended without a last token (cannot happen with budget >= 1)
                yield GenerationChunk(finish_reason=LENGTH, prompt_tokens=len(prompt), completion_tokens=len(new))
        finally:
            halt.set()
            await asyncio.shield(done)

    def _text(self, new: list[int], last: bool) -> str:
        """The text of the new tokens so far; a trailing partial character (U+FFFD of a token that ends inside
        one) is held back until the token that completes it, or the last."""
        if self.generator.decode is None:
            return ""
        text = self.generator.decode(new)
        return text if last else text.rstrip("\ufffd")


def _first_stop(text: str, stops, after: int) -> Optional[int]:
    """Where the first stop string begins in `text` (searching from what may still be cut), else None."""
    found = [i for s in stops if s and (i := text.find(s, max(0, after - len(s) + 1))) >= 0]
    return min(found) if found else None
