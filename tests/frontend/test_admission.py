"""The fair queue in front of each model and who a client is."""

from __future__ import annotations

import asyncio
import os
import socket

import pytest

from wide_export.base.errors import WideError  # noqa: F401 - the package imports
from wide_export.serving.openai.admission import FairQueue, client_of, peer_uid
from wide_export.serving.openai.errors import OpenAIError


def _run(coro):
    """A queue that never hands out a slot fails the test in 30 s instead of hanging it."""
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_a_burst_leaves_one_slot_to_another_client_and_freed_slots_alternate():
    async def main():
        queue = FairQueue(slots=4)  # per client: 3
        a, b, c = ("uid:1", ""), ("uid:2", ""), ("uid:3", "")
        held, order = [], []

        async def take(client, tag):
            ticket = await queue.acquire(client)
            order.append(tag)
            held.append((tag, ticket))

        burst = [asyncio.create_task(take(a, f"a{i}")) for i in range(8)]
        await asyncio.sleep(0)
        assert order == ["a0", "a1", "a2"] and len(queue.waiting) == 5  # the 4th slot stays free for others
        await take(b, "b0")  # another client starts at once
        later = [asyncio.create_task(take(b, "b1")), asyncio.create_task(take(c, "c0"))]
        await asyncio.sleep(0)
        assert order == ["a0", "a1", "a2", "b0"]
        def free(tag):
            ticket = next(t for name, t in held if name == tag)
            held.remove((tag, ticket))
            ticket.release()

        # each freed slot goes to the user running the fewest, the earliest request among equals
        free("a0")  # a runs 2, b 1, c 0: c
        await asyncio.sleep(0)
        free("a1")  # a 1, b 1, c 1: the earliest, a3
        await asyncio.sleep(0)
        free("b0")  # a 2, b 0, c 1: b
        await asyncio.sleep(0)
        assert order == ["a0", "a1", "a2", "b0", "c0", "a3", "b1"], order
        while any(not t.done() for t in burst + later) or held:
            if held:
                held.pop(0)[1].release()
            await asyncio.sleep(0)
        assert queue.busy == 0 and not queue.waiting

    _run(main())


def test_one_slot_models_and_a_per_client_cap_set_by_the_operator():
    async def main():
        one = FairQueue(slots=1)
        ticket = await one.acquire(("x", ""))  # a batch of one: the cap is 1, not 0
        ticket.release()
        ticket.release()  # a second release changes nothing
        assert one.busy == 0
        wide = FairQueue(slots=8, per_client=8)
        tickets = [await wide.acquire(("x", "")) for _ in range(8)]  # the operator lets one client fill it
        assert wide.busy == 8
        for t in tickets:
            t.release()

    _run(main())


def test_too_many_waiting_is_a_503_at_once_and_a_cancelled_waiter_leaves_no_trace():
    async def main():
        queue = FairQueue(slots=1, max_waiting=2)
        first = await queue.acquire(("x", ""))
        waiters = [asyncio.create_task(queue.acquire((who, ""))) for who in ("a", "b")]  # two clients
        await asyncio.sleep(0)
        with pytest.raises(OpenAIError) as err:
            await queue.acquire(("y", ""))
        assert err.value.status == 503
        waiters[0].cancel()  # its client left
        await asyncio.sleep(0)
        assert len(queue.waiting) == 1
        first.release()
        second = await waiters[1]
        assert queue.busy == 1
        second.release()
        assert queue.busy == 0 and not queue.running

    _run(main())


def test_the_uid_of_a_loopback_peer_is_read_from_proc():
    if not os.path.exists("/proc/net/tcp"):
        pytest.skip("no /proc/net/tcp (not Linux)")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        with socket.create_connection(server.getsockname()) as client:
            conn, peer = server.accept()
            with conn:
                assert peer_uid(peer, server.getsockname()) == os.getuid()
                scope = {"client": peer, "server": server.getsockname()}
                assert client_of(scope, "alice") == (f"uid:{os.getuid()}", "alice")
                assert client_of(scope, None) == (f"uid:{os.getuid()}", "")
    assert peer_uid(("127.0.0.1", 1), ("127.0.0.1", 2)) is None  # no such connection
    assert client_of({"client": ("10.1.2.3", 5555), "server": ("10.1.2.4", 80)}, None) == ("10.1.2.3", "")


def test_a_waiter_cancelled_while_a_slot_frees_leaves_no_slot_held():
    """A waiter whose client left is cancelled first and removed from the queue a loop turn later; a slot
    freed in between went to it (InvalidStateError, and a slot held for ever)."""
    async def main():
        queue = FairQueue(slots=2, per_client=2)
        t1, t2 = await queue.acquire(("a", "")), await queue.acquire(("a", ""))
        waiter = asyncio.create_task(queue.acquire(("b", "")))
        await asyncio.sleep(0)
        waiter.cancel()
        t1.release()  # the same turn: the waiter is cancelled but still listed
        with pytest.raises(asyncio.CancelledError):
            await waiter
        t2.release()
        assert queue.busy == 0 and not queue.waiting

    _run(main())


def test_one_client_filling_the_queue_does_not_lock_another_out():
    async def main():
        queue = FairQueue(slots=4, max_waiting=6)  # per client 3; one client may have 3 waiting
        a, b = ("uid:1", ""), ("uid:2", "")
        held = [await queue.acquire(a) for _ in range(3)]
        waiting = [asyncio.create_task(queue.acquire(a)) for _ in range(3)]
        await asyncio.sleep(0)
        with pytest.raises(OpenAIError) as err:
            await queue.acquire(a)
        assert err.value.status == 429 and err.value.type == "rate_limit_exceeded"
        other = await asyncio.wait_for(queue.acquire(b), 1)  # the free slot, at once
        assert queue.busy == 4
        for t in held + [other]:
            t.release()
        for t in await asyncio.gather(*waiting):
            t.release()
        assert queue.busy == 0

    _run(main())
