"""Memory of `serve --model` under many requests (docs/cpu.md, "Memory under client disconnects"): a generation's
KV cache is freed when the generation ends - finished or dropped by its client - by reference counting, not left
in a reference cycle for Python's cyclic collector, whose full pass runs only after many thousands of
requests in a server with torch loaded (RSS grew ~0.2 MB a hundred streams with no plateau;
scripts/soak-disconnects.py). The cyclic collector is off while each test runs, so anything only it frees
shows up as alive."""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest

from tests.cpu.test_generation import SPECS
from tests.helpers import make_checkpoint

PROMPT = [5, 9, 13, 2, 7]


@pytest.fixture(scope="module")
def generator(tmp_path_factory):
    from wide_export.generation.cpu_generator import CpuGenerator

    return CpuGenerator.load(make_checkpoint(tmp_path_factory.mktemp("mem") / "ck", num_layers=2,
                                             **SPECS["llama"]))


@pytest.fixture
def caches(generator, monkeypatch):
    """Weak references to every KV cache tensor the model allocates while the test runs; gc off meanwhile."""
    made: list = []
    real = generator.model.static_cache

    def static_cache(*args, **kw):
        layers = real(*args, **kw)
        made.extend(weakref.ref(t) for kv in layers for t in (kv.k, kv.v))
        return layers

    monkeypatch.setattr(generator.model, "static_cache", static_cache)
    gc.collect()
    gc.disable()
    try:
        yield made
    finally:
        gc.enable()


def _alive(refs) -> int:
    return sum(r() is not None for r in refs)


def test_a_finished_generation_frees_its_kv_cache(generator, caches):
    tokens = generator.stream(PROMPT, 8)
    assert len(tokens) == 8 and len(caches) == 2 * generator.model.config.num_layers
    assert _alive(caches) == 0


def test_a_stream_its_client_drops_frees_its_kv_cache(generator, caches):
    from wide_export.serving.cpu_engine import CpuEngine
    from wide_export.serving.openai.engine import GenerationRequest

    engine = CpuEngine(generator, "wide")

    async def go():
        chunks = engine.generate(GenerationRequest(model="wide", prompt_ids=PROMPT, max_tokens=200))
        await anext(chunks)
        await chunks.aclose()  # the client went away: the worker stops at its next token

    try:
        asyncio.run(go())
    finally:
        asyncio.run(engine.close())
    assert caches and _alive(caches) == 0
