"""A scripted Engine and stand-in tokenizers for the frontend tests (no tritonserver)."""

from __future__ import annotations

import asyncio
import threading
from typing import Optional, Sequence

from wide_export.serving.openai.chat import ModelText
from wide_export.serving.openai.engine import EngineError, GenerationChunk, GenerationRequest
from wide_export.serving.openai.models import ServedModel

MODEL = "wide_llm"
PIECES = ("Hel", "lo", "", " wor", "ld")  # "" = a token whose text is held back (a split character)
PROMPT_TOKENS = 7


class FakeEngine:
    """Answers every request with `pieces` (one token each), records requests and cancellations."""

    def __init__(self, names: Sequence[str] = (MODEL,), pieces: Sequence[str] = PIECES, finish: str = "length",
                 delay: float = 0.0, fail: Optional[EngineError] = None, fail_after: Optional[int] = None,
                 ready: bool = True, endless: bool = False):
        self.names = list(names)
        self.pieces, self.finish, self.delay = list(pieces), finish, delay
        self.fail, self.fail_after, self.is_ready, self.endless = fail, fail_after, ready, endless
        self.requests: list[GenerationRequest] = []
        self.cancelled = threading.Event()  # set when a generation was closed before its end
        self.started = self.closed = False
        self.yielded = 0

    async def start(self) -> None:
        self.started = True

    async def close(self) -> None:
        self.closed = True

    async def ready(self) -> bool:
        return self.is_ready

    def models(self) -> list[str]:
        return list(self.names)

    async def generate(self, request: GenerationRequest):
        self.requests.append(request)
        if self.fail is not None:
            raise self.fail
        complete = False
        try:
            i = 0
            while True:
                if self.delay:
                    await asyncio.sleep(self.delay)
                if self.fail_after is not None and i == self.fail_after:
                    raise EngineError("internal", "the model failed mid-generation")
                piece = self.pieces[i % len(self.pieces)]
                last = not self.endless and i == len(self.pieces) - 1
                self.yielded += 1
                complete = last  # the consumer may close the generator once it has the finish_reason
                yield GenerationChunk(text=piece, token_ids=(100 + i,), finish_reason=self.finish if last else None,
                                      prompt_tokens=PROMPT_TOKENS, completion_tokens=i + 1)
                if last:
                    break
                i += 1
        finally:
            if not complete:
                self.cancelled.set()


class FakeTokenizer:
    """apply_chat_template of a template `<role>content` per message, then `<assistant>`."""

    def __init__(self, chat_template: Optional[str] = "fake"):
        self.chat_template = chat_template

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        assert tokenize is False
        text = "<s>" + "".join(f"<{m['role']}>{m['content']}\n" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")


def served(name: str = MODEL, text: Optional[ModelText] = None, max_model_len: int = 64) -> ServedModel:
    return ServedModel(name=name, triton_name=name, folder=None, max_model_len=max_model_len,
                       text=text if text is not None else ModelText(FakeTokenizer()))


class SlowCodecGenerator:
    """What CpuEngine (serving/cpu_engine.py) uses of cpu.generation.CpuGenerator, with a tokenizer that holds its
    thread: encode sleeps `encode_s` (then gives one token per 4 characters), decode sleeps `decode_s`;
    `encoding` / `decoding` are set when one starts. The model answers `tokens`."""

    def __init__(self, encode_s: float = 0.0, decode_s: float = 0.0, tokens: Sequence[int] = (5, 6, 7),
                 max_model_len: int = 64, vocab: int = 100):
        from types import SimpleNamespace

        self.encode_s, self.decode_s, self.tokens = encode_s, decode_s, list(tokens)
        self.model = SimpleNamespace(config=SimpleNamespace(vocab_size=vocab, max_position_embeddings=max_model_len))
        self.eos: set[int] = set()
        self.encoding, self.decoding = threading.Event(), threading.Event()

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        import time

        self.encoding.set()
        time.sleep(self.encode_s)  # a long prompt's tokenizing, which holds its thread
        return [1] * max(1, len(text) // 4)

    def decode(self, ids) -> str:
        import time

        self.decoding.set()
        time.sleep(self.decode_s)
        return "".join(chr(ord("a") + int(i) % 26) for i in ids)

    def stream(self, prompt, max_new_tokens, sampling=None, on_token=None, stop=None) -> list[int]:
        out = []
        for token in self.tokens[:max_new_tokens]:
            out.append(token)
            if on_token is not None:
                on_token(token)
            if stop is not None and stop(token):
                break
        return out
