"""serving/openai/sse.py by itself: the event format, awaiting a result against a client's disconnect, and an
event stream closed (its generator's `finally` run) as soon as the client goes away -- on a scripted ASGI
receive/send, no server."""

from __future__ import annotations

import asyncio
import json

import pytest

from wide_export.serving.openai.sse import DONE, ClientGone, EventStream, event, until_disconnect


def test_event_is_one_compact_json_data_line():
    assert event({"a": 1, "b": [1, 2], "t": "é"}) == 'data: {"a":1,"b":[1,2],"t":"é"}\n\n'
    assert json.loads(event({"x": None})[len("data: "):]) == {"x": None}
    assert DONE == "data: [DONE]\n\n"


class _Request:
    """receive() gives the scripted messages, each after its delay; then waits forever."""

    def __init__(self, *messages, delay=0.0):
        self.messages, self.delay, self.received = list(messages), delay, 0

    async def receive(self):
        if not self.messages:
            await asyncio.Event().wait()
        await asyncio.sleep(self.delay)
        self.received += 1
        return self.messages.pop(0)


def test_the_result_when_it_comes_before_a_disconnect():
    async def main():
        async def work():
            await asyncio.sleep(0.01)
            return 42

        return await until_disconnect(_Request(), work())

    assert asyncio.run(main()) == 42


def test_a_disconnect_first_cancels_the_work_and_raises_client_gone():
    state = {}

    async def main():
        async def work():
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                state["cancelled"] = True
                raise

        request = _Request({"type": "http.request", "body": b""}, {"type": "http.disconnect"}, delay=0.01)
        with pytest.raises(ClientGone):
            await until_disconnect(request, work())
        state["received"] = request.received

    asyncio.run(main())
    assert state == {"cancelled": True, "received": 2}  # other messages are read past, not taken as a leave


def test_the_works_error_is_raised_as_is():
    async def main():
        async def work():
            raise ValueError("model broke")

        await until_disconnect(_Request(), work())

    with pytest.raises(ValueError, match="model broke"):
        asyncio.run(main())


def test_work_done_as_the_client_leaves_keeps_its_result():
    """Work that finishes before the disconnect is read: its result stands (it was not cancelled)."""
    async def main():
        async def work():
            return "done"

        return await until_disconnect(_Request({"type": "http.disconnect"}, delay=0.05), work())

    assert asyncio.run(main()) == "done"


class _Client:
    """An ASGI client: records what is sent, disconnects after `leave_after` body chunks."""

    def __init__(self, leave_after=None):
        self.sent, self.leave_after = [], leave_after
        self.gone = asyncio.Event()

    async def send(self, message):
        self.sent.append(message)
        bodies = [m for m in self.sent if m["type"] == "http.response.body" and m.get("body")]
        if self.leave_after is not None and len(bodies) >= self.leave_after:
            self.gone.set()

    async def receive(self):
        if self.leave_after is None:
            await asyncio.Event().wait()
        await self.gone.wait()
        return {"type": "http.disconnect"}


def _scope():
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.0"}, "method": "GET", "path": "/",
            "headers": []}


def test_a_whole_stream_is_sent_with_its_headers():
    async def events():
        for i in range(3):
            yield event({"i": i})
        yield DONE

    async def main():
        client = _Client()
        await asyncio.wait_for(EventStream(events())(_scope(), client.receive, client.send), 10)
        return client.sent

    sent = asyncio.run(main())
    start = sent[0]
    assert start["type"] == "http.response.start" and start["status"] == 200
    headers = {k.decode(): v.decode() for k, v in start["headers"]}
    assert headers["content-type"].startswith("text/event-stream")
    assert headers["cache-control"] == "no-cache" and headers["x-accel-buffering"] == "no"
    body = b"".join(m.get("body", b"") for m in sent[1:]).decode()
    assert body == 'data: {"i":0}\n\ndata: {"i":1}\n\ndata: {"i":2}\n\ndata: [DONE]\n\n'


def test_extra_headers_are_kept_beside_ours():
    async def events():
        yield DONE

    async def main():
        client = _Client()
        await asyncio.wait_for(EventStream(events(), headers={"X-Request-Id": "abc"})(
            _scope(), client.receive, client.send), 10)
        return {k.decode(): v.decode() for k, v in client.sent[0]["headers"]}

    headers = asyncio.run(main())
    assert headers["x-request-id"] == "abc" and headers["cache-control"] == "no-cache"


def test_a_client_leaving_closes_the_events_at_once():
    state = {"yielded": 0}

    async def events():
        try:
            while True:
                state["yielded"] += 1
                yield event({"n": state["yielded"]})
                await asyncio.sleep(0.01)
        finally:
            state["closed"] = True  # where the engine request is cancelled

    async def main():
        client = _Client(leave_after=2)
        await asyncio.wait_for(EventStream(events())(_scope(), client.receive, client.send), 10)
        state["closed_before_return"] = state.get("closed", False)

    asyncio.run(main())
    assert state["closed_before_return"] is True
    assert state["yielded"] < 50  # stopped at the leave, not run on


def test_a_broken_connection_while_sending_ends_the_stream_quietly():
    state = {}

    async def events():
        try:
            yield event({"n": 1})
            yield event({"n": 2})
        finally:
            state["closed"] = True

    async def main():
        async def send(message):
            if message["type"] == "http.response.body" and message.get("body"):
                raise OSError("connection reset")

        async def receive():
            await asyncio.Event().wait()

        await asyncio.wait_for(EventStream(events())(_scope(), receive, send), 10)

    asyncio.run(main())
    assert state == {"closed": True}


def test_other_response_arguments_reach_starlette():
    async def events():
        yield DONE

    async def main():
        client = _Client()
        await asyncio.wait_for(EventStream(events(), status_code=202)(_scope(), client.receive, client.send), 10)
        return client.sent[0]["status"]

    assert asyncio.run(main()) == 202
