"""The official `openai` client against the frontend on a real uvicorn server (127.0.0.1), fake engine."""

from __future__ import annotations

import socket
import time

import pytest

openai = pytest.importorskip("openai")

from tests.frontend.fakes import MODEL, PIECES, PROMPT_TOKENS, FakeEngine, FakeTokenizer, served  # noqa: E402
from wide_export.base.errors import WideError  # noqa: E402
from wide_export.serving.openai.chat import ModelText  # noqa: E402
from wide_export.serving.openai.engine import EngineError  # noqa: E402
from wide_export.serving.openai.runner import bind_socket  # noqa: E402

FULL_TEXT = "".join(PIECES)
MESSAGES = [{"role": "user", "content": "hi"}]


def client_for(frontend, **kw):
    return openai.OpenAI(base_url=frontend.url, api_key="none", max_retries=0, timeout=kw.pop("timeout", 30), **kw)


def test_completions_whole_and_streamed_through_the_openai_client(live):
    engine = FakeEngine()
    client = client_for(live(engine))
    whole = client.completions.create(model=MODEL, prompt="hi", max_tokens=5, temperature=0)
    assert whole.choices[0].text == FULL_TEXT and whole.choices[0].finish_reason == "length"
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (PROMPT_TOKENS, len(PIECES))
    assert engine.requests[-1].max_tokens == 5 and engine.requests[-1].temperature == 0

    chunks = list(client.completions.create(model=MODEL, prompt="hi", max_tokens=5, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    usage = [c for c in chunks if c.usage is not None]
    assert len(usage) == 1 and usage[0] is chunks[-1] and chunks[-1].choices == []
    assert usage[0].usage.total_tokens == whole.usage.total_tokens
    assert "".join(c.choices[0].text for c in chunks[:-1]) == FULL_TEXT
    assert [c.choices[0].finish_reason for c in chunks[:-1]][-1] == "length"


def test_chat_whole_and_streamed_through_the_openai_client(live):
    engine = FakeEngine(finish="stop")
    client = client_for(live(engine))
    whole = client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, seed=1)
    assert whole.choices[0].message.role == "assistant" and whole.choices[0].message.content == FULL_TEXT
    assert whole.choices[0].finish_reason == "stop"
    assert engine.requests[-1].prompt == FakeTokenizer().apply_chat_template(MESSAGES, add_generation_prompt=True)

    stream = client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content == ""
    assert "".join(c.choices[0].delta.content or "" for c in chunks[1:-1]) == FULL_TEXT
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert sum(c.usage is not None for c in chunks) == 1


def test_vllm_extras_through_extra_body(live):
    engine = FakeEngine()
    client = client_for(live(engine))
    out = client.completions.create(model=MODEL, prompt=[3, 4], max_tokens=5, temperature=0,
                                    extra_body={"ignore_eos": True, "return_token_ids": True})
    assert engine.requests[-1].ignore_eos is True and engine.requests[-1].prompt_ids == [3, 4]
    assert out.choices[0].model_extra["token_ids"] == [100 + i for i in range(len(PIECES))]


def test_errors_are_the_openai_clients_typed_errors(live):
    frontend = live(FakeEngine(), [served(), served("plain", text=ModelText(FakeTokenizer(chat_template=None)))])
    client = client_for(frontend)
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL, prompt="x", temperature="hot")
    assert err.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL, prompt="x", n=2)
    assert err.value.body["param"] == "n"
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="gpt-9", messages=MESSAGES)
    assert err.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError, match="no chat template"):
        client.chat.completions.create(model="plain", messages=MESSAGES)


def test_not_ready_is_503(live):
    engine = FakeEngine(ready=False, fail=EngineError("unavailable", "Request for unknown model: 'wide_llm'"))
    frontend = live(engine)
    client = client_for(frontend)
    with pytest.raises(openai.InternalServerError) as err:
        client.completions.create(model=MODEL, prompt="x")
    assert err.value.status_code == 503
    with pytest.raises(openai.InternalServerError) as err:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
    assert err.value.status_code == 503
    import urllib.error
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with pytest.raises(urllib.error.HTTPError) as err:
        opener.open(frontend.url.removesuffix("/v1") + "/health", timeout=10)
    assert err.value.code == 503


def test_error_after_the_first_token_raises_in_the_stream(live):
    client = client_for(live(FakeEngine(fail_after=2)))
    stream = client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
    seen = []
    with pytest.raises(openai.APIError, match="mid-generation"):
        for chunk in stream:
            seen.append(chunk.choices[0].delta.content)
    assert seen == ["", "Hel", "lo"]


def _wait(event, seconds=10.0) -> bool:
    return event.wait(seconds)


def test_client_leaving_a_stream_cancels_the_generation(live):
    engine = FakeEngine(endless=True, delay=0.02)
    client = client_for(live(engine))
    stream = client.completions.create(model=MODEL, prompt="x", max_tokens=10_000, stream=True)
    it = iter(stream)
    next(it), next(it)
    stream.close()
    assert _wait(engine.cancelled), "the engine generation was not cancelled after the client left"
    n = engine.yielded
    time.sleep(0.2)
    assert engine.yielded == n  # and it stopped producing


def test_client_leaving_a_whole_request_cancels_the_generation(live):
    engine = FakeEngine(endless=True, delay=0.02)
    client = client_for(live(engine), timeout=0.5)
    with pytest.raises(openai.APITimeoutError):
        client.chat.completions.create(model=MODEL, messages=MESSAGES)
    assert _wait(engine.cancelled), "the engine generation was not cancelled after the client left"


def test_finished_streams_are_not_reported_as_cancelled(live):
    engine = FakeEngine()
    client = client_for(live(engine))
    for _ in range(3):
        list(client.completions.create(model=MODEL, prompt="x", stream=True))
        client.completions.create(model=MODEL, prompt="x")
    assert not engine.cancelled.is_set()


def test_taken_port_is_one_line_error():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(WideError, match="already in use") as err:
            bind_socket("127.0.0.1", port)
    assert "\n" not in str(err.value) and err.value.hint


def test_stop_closes_the_port_and_the_engine(live):
    engine = FakeEngine()
    frontend = live(engine)
    port = frontend.port
    assert engine.started
    frontend.stop()
    assert engine.closed and not frontend.alive()
    bind_socket("127.0.0.1", port).close()  # free again


def test_an_engine_that_cannot_connect_stops_the_start_with_one_line():
    from wide_export.serving.openai.runner import Frontend

    class Unreachable(FakeEngine):
        async def start(self):
            raise EngineError("unavailable", "failed to connect to all addresses")

    sock = bind_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    with pytest.raises(WideError, match="failed to connect to all addresses") as err:
        Frontend([served()], sock, engine=Unreachable()).start()
    assert "\n" not in str(err.value)
    bind_socket("127.0.0.1", port).close()  # the port was released
