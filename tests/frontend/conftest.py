"""Fixtures: the app on a fake engine, in-process (TestClient) or on a real uvicorn server."""

from __future__ import annotations

import json

import pytest

from tests.frontend.fakes import FakeEngine, served


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


def make_client(engine, models=None):
    from fastapi.testclient import TestClient

    from wide_export.serving.openai.app import create_app

    return TestClient(create_app(engine, models if models is not None else [served()]))


@pytest.fixture
def client(engine):
    with make_client(engine) as c:
        yield c


def sse_payloads(text: str) -> list:
    """The `data:` payloads of an SSE body, JSON-decoded, `[DONE]` kept as the string."""
    out = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: "), block
        data = block[len("data: "):]
        out.append(data if data == "[DONE]" else json.loads(data))
    return out


@pytest.fixture
def live():
    """Start a uvicorn frontend on 127.0.0.1 (free port) for the given engine/models; stopped at the end."""
    from wide_export.serving.openai.runner import Frontend, bind_socket

    started = []

    def start(engine, models=None) -> Frontend:
        frontend = Frontend(models if models is not None else [served()], bind_socket("127.0.0.1", 0),
                            engine=engine).start()
        started.append(frontend)
        return frontend

    yield start
    for frontend in started:
        frontend.stop()
