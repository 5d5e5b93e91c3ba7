"""Child processes we start, each in its own process group, so an interrupt stops all of it: the one helper
every command uses to start (`start`), run to the end (`run_group`) and stop (`stop_group`) a child.

A tool such as CMake starts ninja, which starts the Triton AOT compiler, which starts worker
processes, which start ptxas: killing only the first leaves the others running, orphaned to PID 1.
Each child here leads a new session (its own process group, away from the terminal's, so a Ctrl-C
reaches us alone and we stop the group in order): on any exception, KeyboardInterrupt included,
the whole group gets SIGTERM, then SIGKILL after a grace period, and we wait until it is gone.
A child that must not outlive us however we die (`kill -9` included: tritonserver, the ranks of
`run-tp`, TensorRT-RTX's child) is also started with `die_with_parent`: Linux sends it SIGTERM when
the thread that started it is gone (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Any, Callable, Optional, Sequence, TextIO

from wide_export.base.signals import shielded


def _in_child(parent: int, die_with_parent: bool, umask: Optional[int]) -> Callable[[], None]:
    """What runs in the child between fork and exec: the umask, and the parent-death signal (skipped where
    prctl is missing; a parent already gone by then is acted on at once, as the signal would)."""

    def child() -> None:
        if umask is not None:
            os.umask(umask)
        if not die_with_parent:
            return
        import ctypes

        try:
            prctl = ctypes.CDLL(None, use_errno=True).prctl
        except (OSError, AttributeError):
            return
        prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)

    return child


def start(cmd: Sequence[str], *, die_with_parent: bool = False, umask: Optional[int] = None,
          **popen: Any) -> subprocess.Popen:
    """subprocess.Popen(cmd, **popen) leading its own session (process group), optionally with a umask and
    SIGTERM when this process dies; stop it with stop_group."""
    hook = _in_child(os.getpid(), die_with_parent, umask) if die_with_parent or umask is not None else None
    return subprocess.Popen(list(cmd), start_new_session=True, preexec_fn=hook, **popen)


def _group_members(pgid: int) -> list[int]:
    """PIDs whose process group is `pgid` and that are not zombies (Linux /proc; empty elsewhere)."""
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            found.append(int(name))
    return found


def stop_group(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """SIGTERM the process group `proc` leads, SIGKILL what is left after `grace` s; wait until no live
    member remains (at most a few seconds more). Signals arriving meanwhile are recorded, not raised."""
    with shielded():
        pgid = proc.pid
        for sig, wait_s in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline:
                if proc.poll() is not None and not _group_members(pgid):
                    break
                time.sleep(0.05)
            else:
                continue
            break
        try:
            proc.wait(5.0)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL was sent
            pass


def run_group(cmd: Sequence[str], *, log: Optional[TextIO] = None, on_line: Optional[Callable[[str], None]] = None,
              env: Optional[dict] = None, cwd: Optional[str] = None) -> int:
    """Run `cmd` in its own process group, its stdout+stderr copied line by line to `log` and `on_line`;
    its exit code. Any exception (Ctrl-C, SIGTERM as KeyboardInterrupt) stops the whole group first."""
    proc = start(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                 errors="replace", bufsize=1, env=env, cwd=cwd)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if log is not None:
                log.write(line)
                log.flush()
            if on_line is not None:
                on_line(line.rstrip("\n"))
        return proc.wait()
    except BaseException:
        stop_group(proc)
        raise
    finally:
        if proc.stdout is not None:
            proc.stdout.close()
