"""What one connection and one request may cost the OpenAI frontend before it refuses.

uvicorn times out only a connection idle *between* requests (its keep-alive timer
starts after a response and stops at the first byte); a connection that sends
nothing, half a header, or a body that never ends stays open forever, and enough
of them exhaust the process's file descriptors. `guarded_protocol` is uvicorn's
own h11 protocol with what it lacks:

- a header deadline (`header_timeout_s`) from the connection's start, and again
  after each response, until a request's header is complete;
- a body deadline (`body_timeout_s`) from the header until the body is complete;
- a cap on open connections (`max_connections`): one beyond it gets a 503 in
  OpenAI's error shape and is closed at once, so it never holds a descriptor.
  The default leaves RESERVED_FDS of the process's descriptor limit to
  everything else (the gRPC channel, /proc reads of the supervisor, logs).

`BodyLimit` is an ASGI middleware that refuses a body over `max_body_bytes` with
413 before anything parses it (Content-Length at once, a chunked body as it
arrives), and hands the app the body it read. Request counts and fairness are
`admission.py`'s.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Optional

log = logging.getLogger("wide_export.serving.openai")

RESERVED_FDS = 96  # descriptors kept for everything but client connections
MIB = 1 << 20


def fd_limit() -> Optional[int]:
    """This process's soft RLIMIT_NOFILE, first raised to the hard limit (as vLLM does); None where unknown."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard != resource.RLIM_INFINITY and soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        return None if soft == resource.RLIM_INFINITY else int(soft)
    except (ImportError, OSError, ValueError):
        return None


def default_max_connections() -> int:
    """Open connections allowed: 4096, or fewer when the descriptor limit is lower (never under 8)."""
    limit = fd_limit()
    return 4096 if limit is None else max(8, min(4096, limit - RESERVED_FDS))


@dataclass(frozen=True)
class Limits:
    """The frontend's limits (`serve` flags of the same names)."""

    max_connections: int = 4096
    max_body_bytes: int = 2 * MIB
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    keep_alive_s: float = 5.0

    @classmethod
    def for_this_process(cls, max_connections: Optional[int] = None, **kw) -> "Limits":
        return cls(max_connections=max_connections or default_max_connections(), **kw)


def error_bytes(status: int, reason: str, message: str, kind: str) -> bytes:
    """A whole HTTP/1.1 response in OpenAI's error shape that closes the connection."""
    body = json.dumps({"error": {"message": message, "type": kind, "param": None, "code": None}}).encode()
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            f"retry-after: 1\r\nconnection: close\r\n\r\n").encode() + body


def guarded_protocol(limits: Limits):
    """uvicorn's H11Protocol with header/body deadlines and a connection cap (see the module doc)."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    full = error_bytes(503, "Service Unavailable", f"the server has {limits.max_connections} connections open, "
                       "its limit; retry shortly", "service_unavailable")

    class GuardedH11Protocol(H11Protocol):
        _deadline = None  # asyncio.TimerHandle of the header or body deadline
        _refused = False

        def connection_made(self, transport) -> None:  # type: ignore[override]
            if len(self.server_state.connections) >= limits.max_connections:
                self._refused = True
                self.transport = transport
                transport.write(full)
                transport.close()
                return
            super().connection_made(transport)
            self._arm(limits.header_timeout_s, "header")

        def connection_lost(self, exc) -> None:
            self._disarm()
            if not self._refused:
                super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return
            super().data_received(data)
            self._follow()

        def on_response_complete(self) -> None:
            super().on_response_complete()  # may already parse a pipelined request buffered meanwhile
            if self.transport.is_closing():
                return
            if self.conn.their_state is h11.IDLE:
                self._arm(limits.header_timeout_s, "header")  # the next request's header, on a kept-alive line
            else:
                self._follow()  # a pipelined request: its body's deadline, or none when it is all in

        def _follow(self) -> None:
            """After bytes arrived: body deadline once the header is in, none once the body is."""
            state = self.conn.their_state
            if state is h11.SEND_BODY and getattr(self, "_phase", None) != "body":
                self._arm(limits.body_timeout_s, "body")
            elif state is not h11.IDLE and state is not h11.SEND_BODY:
                self._disarm()

        def _arm(self, seconds: float, phase: str) -> None:
            self._disarm()
            self._phase = phase
            self._deadline = self.loop.call_later(seconds, self._expired, phase)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None
            self._phase = None

        def _expired(self, phase: str) -> None:
            self._deadline = None
            if self.transport.is_closing():
                return
            if phase == "body" or self.conn.their_state is not h11.IDLE or self.conn.trailing_data[0]:
                what = "the request body" if phase == "body" else "the request header"
                seconds = limits.body_timeout_s if phase == "body" else limits.header_timeout_s
                self.transport.write(error_bytes(408, "Request Timeout", f"{what} did not arrive within "
                                                 f"{seconds:g} s", "invalid_request_error"))
            self.transport.close()  # a connection that sent nothing is just closed

    return GuardedH11Protocol


class BodyLimit:
    """ASGI middleware: a request body over `max_bytes` is a 413 before the app sees any of it."""

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        try:
            if declared is not None and int(declared) > self.max_bytes:
                return await self._refuse(send, int(declared))
        except ValueError:
            pass  # h11 already refused a malformed length
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                return await self._refuse(send, None)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: the disconnect, when it comes

        await self.app(scope, replay, send)

    async def _refuse(self, send, declared: Optional[int]) -> None:
        size = f" ({declared} bytes)" if declared is not None else ""
        body = json.dumps({"error": {
            "message": f"the request body{size} is over this server's limit of {self.max_bytes} bytes",
            "type": "invalid_request_error", "param": None, "code": "request_too_large"}}).encode()
        await send({"type": "http.response.start", "status": 413, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body, "more_body": False})
