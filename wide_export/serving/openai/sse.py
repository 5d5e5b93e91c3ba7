"""Server-sent events and client disconnects.

`EventStream` sends an async iterator of `data: ...` events and cancels it as soon
as the client disconnects (it always listens for `http.disconnect`, whatever ASGI
spec version the server announces), so the generator's `finally` runs and the
engine request is cancelled. `until_disconnect` does the same for a coroutine
awaited inside a handler (a non-streaming generation, or the wait for a stream's
first token), as vLLM's `with_cancellation` does.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Awaitable, Optional, TypeVar

import anyio
from starlette.requests import Request
from starlette.responses import StreamingResponse

T = TypeVar("T")
DONE = "data: [DONE]\n\n"


class ClientGone(Exception):
    """The client disconnected before the answer was ready."""


def event(payload: Any) -> str:
    """One SSE event with a JSON payload."""
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


class ShuttingDown(Exception):
    """The server stops: what is still waiting ends with a 503 (a stream: an error event and [DONE])."""


async def until_disconnect(request: Request, awaitable: Awaitable[T], closing: Optional[asyncio.Event] = None) -> T:
    """The result of `awaitable`, or ClientGone when the client disconnects first, or ShuttingDown when
    `closing` is set first (it is then cancelled)."""
    task = asyncio.ensure_future(awaitable)
    watchers = [asyncio.ensure_future(_wait_disconnect(request))]
    if closing is not None:
        watchers.append(asyncio.ensure_future(closing.wait()))
    try:
        await asyncio.wait({task, *watchers}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for watcher in watchers:
            watcher.cancel()
        if not task.done():
            task.cancel()
            try:
                await task
            except BaseException:  # noqa: BLE001 - it was cancelled on purpose
                pass
    if task.cancelled():
        if closing is not None and closing.is_set():
            raise ShuttingDown()
        raise ClientGone()
    return task.result()


async def unless_closing(awaitable: Awaitable[T], closing: Optional[asyncio.Event]) -> T:
    """The result of `awaitable`, or ShuttingDown when `closing` is set first (it is then cancelled)."""
    if closing is None:
        return await awaitable
    task = asyncio.ensure_future(awaitable)
    stop = asyncio.ensure_future(closing.wait())
    try:
        await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
        if not task.done():
            task.cancel()
            try:
                await task
            except BaseException:  # noqa: BLE001 - cancelled on purpose
                pass
    if task.cancelled():
        raise ShuttingDown()
    return task.result()


class EventStream(StreamingResponse):
    """text/event-stream whose body is cancelled when the client goes away."""

    media_type = "text/event-stream"

    def __init__(self, content, after=None, **kwargs):
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(kwargs.pop("headers", None) or {})}
        super().__init__(content, headers=headers, **kwargs)
        self.after = after  # called once the response is over, however it ended (even before the body started)

    async def __call__(self, scope, receive, send) -> None:
        try:
            await self._run(scope, receive, send)
        finally:
            if self.after is not None:
                self.after()

    async def _run(self, scope, receive, send) -> None:
        async with anyio.create_task_group() as group:

            async def body() -> None:
                try:
                    await self.stream_response(send)
                except OSError:  # the connection broke while sending
                    pass
                finally:
                    # Cancelled while sending: close the events now (their `finally` cancels the engine
                    # request), not whenever the garbage collector finalizes them.
                    with anyio.CancelScope(shield=True):
                        await self.body_iterator.aclose()
                group.cancel_scope.cancel()

            group.start_soon(body)
            await self.listen_for_disconnect(receive)
            group.cancel_scope.cancel()
