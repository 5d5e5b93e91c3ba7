"""Tokenizing and detokenizing run off the event loop (as vLLM's): a prompt that takes long to encode, or an
answer that takes long to decode, must not hold /health or any other request. The CPU front door
(cpu/engine.CpuEngine, `serve --model`) over a generator whose tokenizer sleeps (fakes.SlowCodecGenerator)."""

from __future__ import annotations

import threading
import time

import pytest

from tests.frontend.fakes import MODEL, SlowCodecGenerator, served
from tests.frontend.test_request_limits import _call

pytest.importorskip("fastapi")

SLOW_S = 1.0
PROMPT = "x" * 850_000  # the prompt: 212,500 tokens here, far over the context: a 400 once tokenized


def _start(live, gen):
    from wide_export.serving.cpu_engine import CpuEngine

    frontend = live(CpuEngine(gen, MODEL), [served(max_model_len=gen.model.config.max_position_embeddings)])
    return frontend.url[:-3]


def _health_while(base: str, started: threading.Event, body: dict) -> tuple[float, tuple]:
    """Seconds /health took while `body` is being tokenized or detokenized, and that request's answer."""
    done = []
    slow = threading.Thread(target=lambda: done.append(_call(base, "POST", "/v1/completions", body)))
    slow.start()
    assert started.wait(10), "the tokenizer was never called"
    t0 = time.monotonic()
    status = _call(base, "GET", "/health", timeout=SLOW_S * 5)[0]
    waited = time.monotonic() - t0
    slow.join(30)
    assert status == 200 and done
    return waited, done[0]


def test_a_long_prompt_is_tokenized_off_the_event_loop(live):
    gen = SlowCodecGenerator(encode_s=SLOW_S)
    base = _start(live, gen)
    waited, (status, text) = _health_while(base, gen.encoding, {"prompt": PROMPT, "max_tokens": 2})
    assert status == 400 and "positions" in text  # the engine's refusal of the prompt, once tokenized
    assert waited < 0.3, f"/health waited {waited:.2f} s for the prompt's tokenizing"


def test_the_answer_is_detokenized_off_the_event_loop(live):
    gen = SlowCodecGenerator(decode_s=SLOW_S, tokens=(7,))
    base = _start(live, gen)
    waited, (status, text) = _health_while(base, gen.decoding, {"prompt": "hi", "max_tokens": 1})
    assert status == 200 and '"h"' in text  # decode of token 7, by the fake's table
    assert waited < 0.3, f"/health waited {waited:.2f} s for the answer's detokenizing"
