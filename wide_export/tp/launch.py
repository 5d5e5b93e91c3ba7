"""Start the ranks of a tensor-parallel run on this machine, one process each, with nothing listening
beyond loopback.

torchrun's rendezvous is a torch TCPStore, which listens on every interface (torch has no setting for
its address), and the workers' store takes a second port of its own. On one machine the ranks need
neither: they meet through a FileStore in a 0700 folder of ours (`init_method=file://...`, read by
`wide_export.tp.run` from WIDE_TP_INIT), and gloo's rank-to-rank sockets are bound to the loopback
interface (GLOO_SOCKET_IFNAME=lo). Several machines still use torchrun (docs/distributed.md).

What torchrun's agent did that we keep: each rank's output is relayed line by line; the first rank that
fails stops the others (they would otherwise wait in a collective for gloo's 30-minute timeout); Ctrl-C
or SIGTERM stops them all.
"""

from __future__ import annotations

import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
from typing import Callable, Sequence

from wide_export.base.childproc import start, stop_group
from wide_export.base.signals import signals_deferred

INIT_ENV = "WIDE_TP_INIT"


def rank_env(base: dict, rank: int, world: int, init: str) -> dict:
    """A rank's environment: who it is, where the ranks meet, gloo on loopback."""
    env = {k: v for k, v in base.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
               GLOO_SOCKET_IFNAME=base.get("GLOO_SOCKET_IFNAME", "lo"), **{INIT_ENV: init})
    return env


def run_ranks(world: int, args: Sequence[str], on_line: Callable[[str], None], env: dict | None = None) -> int:
    """Run `python -m wide_export.tp.run ARGS` as ranks 0..world-1; 0 when all succeed, else the first
    failing rank's exit code (the others stopped)."""
    folder = tempfile.mkdtemp(prefix="wide-tp-")  # 0700: only we can join the ranks' store
    init = f"file://{os.path.join(folder, 'store')}"
    lines: queue.Queue = queue.Queue()
    procs: list[subprocess.Popen] = []

    def relay(proc: subprocess.Popen, rank: int) -> None:
        assert proc.stdout is not None
        with proc.stdout:
            for line in proc.stdout:
                lines.put(line.rstrip("\n"))
        lines.put((rank, proc.wait()))

    try:
        for rank in range(world):
            with signals_deferred():  # a Ctrl-C between the fork and the append would leave this rank running
                proc = start([sys.executable, "-m", "wide_export.tp.run", *args], die_with_parent=True,
                             env=rank_env(dict(env if env is not None else os.environ), rank, world, init),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             text=True, errors="replace", bufsize=1)
                procs.append(proc)
            threading.Thread(target=relay, args=(proc, rank), name=f"wide-tp-rank{rank}", daemon=True).start()
        running, code = world, 0
        while running:
            item = lines.get()
            if isinstance(item, str):
                on_line(item)
                continue
            running -= 1
            if item[1] != 0 and code == 0:
                code = item[1]
                for other in procs:  # the rest would wait in a collective for their partner
                    if other.poll() is None:
                        stop_group(other, grace=2.0)
        while not lines.empty():  # what the stopped ranks printed last
            item = lines.get()
            if isinstance(item, str):
                on_line(item)
        return code
    finally:
        for proc in procs:
            if proc.poll() is None:  # Ctrl-C, SIGTERM, an error here
                stop_group(proc, grace=2.0)
        shutil.rmtree(folder, ignore_errors=True)
