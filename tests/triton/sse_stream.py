"""One HTTP generate_stream client (server-sent events) for the tests of a real tritonserver:
it records each event with its arrival time and can walk away mid-stream, noting what the server
had already sent when it left."""

from __future__ import annotations

import http.client
import json
import socket
import time

import numpy as np

MODEL = "wide_llm"
DEADLINE_S = 120.0  # a bound on a hang, never a timing expectation


class Stream:
    """One HTTP generate_stream request; records each event with its arrival time."""

    def __init__(self, url: str, body: dict, keep: int | None = None, model: str = MODEL):
        self.url, self.body, self.keep, self.model = url, body, keep, model
        self.events: list[dict] = []
        self.times: list[float] = []
        self.status = 0
        self.content_type = ""
        self.pending_at_leave: bytes = b""  # what had arrived, unread, when the client left

    @property
    def left_mid_stream(self) -> bool:
        """Whether the stream's last token event (its finish_reason set) had not reached the client
        when it left. A diagnostic for the leaver tests' failure messages, not proof of a drop: the
        server may have produced the whole stream without having delivered it yet."""
        return b'"finish_reason":"length"' not in self.pending_at_leave.replace(b" ", b"")

    def run(self) -> "Stream":
        host, port = self.url.rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=DEADLINE_S)
        try:
            conn.request("POST", f"/v2/models/{self.model}/generate_stream", body=json.dumps(self.body),
                         headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            self.status = resp.status
            self.content_type = resp.getheader("Content-Type", "")
            deadline = time.monotonic() + DEADLINE_S
            while time.monotonic() < deadline:
                line = resp.readline()
                if not line:
                    break
                if line.startswith(b"data:"):
                    self.events.append(json.loads(line[5:]))
                    self.times.append(time.monotonic())
                    if self.keep is not None and len(self.events) >= self.keep:
                        self.pending_at_leave = _arrived_unread(resp, conn.sock)
                        conn.sock.close()  # the client walks away mid-stream
                        break
        finally:
            conn.close()
        return self

    @property
    def tokens(self) -> list[int]:
        assert all("error" not in e for e in self.events), self.events
        return [int(np.asarray(e["output_ids"]).reshape(-1)[0]) for e in self.events]


def _arrived_unread(resp, sock) -> bytes:
    """The bytes of a response that have arrived but were not read yet (the reader's buffer and the
    socket's), without waiting for more."""
    sock.settimeout(0.0)  # non-blocking: only what is there already
    try:
        buffered = resp.fp.peek(1 << 22) if resp.fp is not None else b""
    except (BlockingIOError, OSError, ValueError):
        buffered = b""
    try:
        queued = sock.recv(1 << 22, socket.MSG_PEEK)
    except (BlockingIOError, OSError):
        queued = b""
    return (buffered or b"") + (queued or b"")
