"""Which generation request runs next: a bounded, fair queue in front of each model.

The generation model runs at most `max_batch_size` rows at once and queues the
rest first come, first served, so one client's burst of 64 long requests made
another client's short one wait for all of them (20.8 s measured). The frontend
now hands a model at most `slots` requests at a time (its max_batch_size) and
decides the order itself:

- Who is a client: the local user behind the connection (its uid, read from
  /proc/net/tcp for a loopback peer: a local user cannot pose as another), else
  the peer's address; within that, the request's OpenAI `user` field.
- One client holds at most `per_client` of a model's slots (default: all but one,
  so another client's request starts at once instead of waiting for a slot).
- A freed slot goes to the waiting request whose local user runs the fewest
  requests, then whose client does, the earliest among equals: round-robin
  between users and clients, first come first served within one. (A local user
  who sends many `user` values can fill every slot; the next slot that frees
  still goes to another user who waits.)
- At most `max_waiting` requests wait per model, at most half of them one
  client's: one more is a 503 (429 for that client) at once, never a pile-up.
"""

from __future__ import annotations

import asyncio
import ipaddress
import itertools
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from wide_export.serving.openai.errors import OpenAIError

Client = tuple[str, str]  # (who: "uid:N" or the peer address, the request's `user` field or "")


def _hex_endpoint(host: str, port: int) -> Optional[str]:
    """host:port as /proc/net/tcp{,6} writes it (the address in host byte order, little-endian here)."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    raw = ip.packed
    words = [raw[i:i + 4][::-1].hex().upper() for i in range(0, len(raw), 4)]
    return f"{''.join(words)}:{port:04X}"


def peer_uid(client: tuple[str, int], server: tuple[str, int], proc: Path = Path("/proc")) -> Optional[int]:
    """The uid owning the client's end of a loopback TCP connection (Linux), else None."""
    ours, theirs = _hex_endpoint(*server), _hex_endpoint(*client)
    if ours is None or theirs is None:
        return None
    for table in ("tcp", "tcp6"):
        try:
            with open(proc / "net" / table) as rows:
                next(rows, None)
                for row in rows:
                    cols = row.split()
                    if len(cols) > 7 and cols[1] == theirs and cols[2] == ours:
                        return int(cols[7])
        except (OSError, ValueError):
            continue
    return None


def client_of(scope: dict, user: Optional[str]) -> Client:
    """Who sent the request (see the module doc)."""
    client, server = scope.get("client"), scope.get("server")
    who = "unknown"
    if client:
        who = client[0]
        try:
            ip = ipaddress.ip_address(client[0])
            mapped = getattr(ip, "ipv4_mapped", None)  # ::ffff:127.0.0.1 on a `::` listener
            loopback = ip.is_loopback or (mapped is not None and mapped.is_loopback)
        except ValueError:
            loopback = False
        if loopback and server:
            uid = peer_uid(tuple(client), tuple(server))
            if uid is not None:
                who = f"uid:{uid}"
    return who, user or ""


@dataclass(frozen=True)
class RequestPolicy:
    """The operator's request limits (`serve` flags)."""

    max_tokens: Optional[int] = None  # per request: above it a 400; the default when a chat asks for none
    per_client: Optional[int] = None  # slots of a model one client may hold (None: all but one)
    max_waiting: int = 256  # requests waiting per model; one more is a 503


@dataclass
class _Waiter:
    client: Client
    order: int
    ready: asyncio.Future = field(repr=False)


class FairQueue:
    """Slots of one model, handed out as the module doc says."""

    def __init__(self, slots: int, per_client: Optional[int] = None, max_waiting: int = 256):
        self.slots = max(1, slots)
        self.per_client = max(1, per_client if per_client is not None else self.slots - 1)
        self.max_waiting = max_waiting
        self.running: Counter = Counter()  # client -> requests running
        self.by_who: Counter = Counter()  # who -> requests running
        self.waiting: list[_Waiter] = []
        self._order = itertools.count()

    @property
    def busy(self) -> int:
        return sum(self.running.values())

    def _may_run(self, client: Client) -> bool:
        return self.busy < self.slots and self.running[client] < self.per_client

    def _eligible(self) -> list[_Waiter]:
        """Waiting requests that may take a slot now (a cancelled one, not yet removed by its task, never)."""
        self.waiting = [w for w in self.waiting if not w.ready.done()]
        return [w for w in self.waiting if self.running[w.client] < self.per_client]

    async def acquire(self, client: Client) -> "Ticket":
        """A slot for `client` (released by the ticket); waits fairly for it. 429 when this client already
        has half of `max_waiting` waiting, 503 when `max_waiting` requests wait."""
        eligible = self._eligible()  # also drops cancelled waiters, before they are counted below
        if self._may_run(client) and not eligible:  # nobody waiting could take the slot instead
            self._take(client)
            return Ticket(self, client)
        mine = sum(1 for w in self.waiting if w.client == client)
        if mine >= max(1, self.max_waiting // 2):
            raise OpenAIError(429, f"{mine} of your requests are waiting for this model, the most one client may "
                                   "have waiting; retry when one is done", code="too_many_requests",
                                   retry_after=1)
        if len(self.waiting) >= self.max_waiting:
            raise OpenAIError(503, f"{len(self.waiting)} requests are waiting for this model, its limit; "
                                   "retry shortly", code="too_many_requests", retry_after=1)
        waiter = _Waiter(client, next(self._order), asyncio.get_running_loop().create_future())
        self.waiting.append(waiter)
        self._hand_out()
        try:
            await waiter.ready
        except BaseException:  # the client left (or the server stops) while it waited
            if waiter in self.waiting:
                self.waiting.remove(waiter)
            if waiter.ready.done() and not waiter.ready.cancelled():
                self._release(client)  # handed a slot just as it was cancelled
            raise
        return Ticket(self, client)

    def _take(self, client: Client) -> None:
        self.running[client] += 1
        self.by_who[client[0]] += 1

    def _release(self, client: Client) -> None:
        self.running[client] -= 1
        self.by_who[client[0]] -= 1
        if self.running[client] <= 0:
            del self.running[client]
        if self.by_who[client[0]] <= 0:
            del self.by_who[client[0]]
        self._hand_out()

    def _hand_out(self) -> None:
        while self.waiting and self.busy < self.slots:
            eligible = self._eligible()
            if not eligible:
                return
            nxt = min(eligible, key=lambda w: (self.by_who[w.client[0]], self.running[w.client], w.order))
            self.waiting.remove(nxt)
            self._take(nxt.client)
            nxt.ready.set_result(None)


class Ticket:
    """One held slot; release() gives it back (once, whoever calls it)."""

    def __init__(self, queue: FairQueue, client: Client):
        self._queue, self._client = queue, client

    def release(self) -> None:
        if self._queue is not None:
            queue, self._queue = self._queue, None
            queue._release(self._client)
