"""childproc: the one helper that starts a child in its own process group (optionally dying with us, with a
umask), and stops the whole group; used by tritonserver, the ranks of run-tp, TensorRT-RTX's child, bench and
the native builds. Real processes, observed from outside (/proc, os.getsid)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from wide_export.base import childproc

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process groups and prctl: Linux")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def test_a_child_leads_its_own_session_with_the_umask_asked():
    proc = childproc.start([sys.executable, "-c", "import os; print(os.umask(0))"], umask=0o077,
                           stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout=30)
    assert int(out) == 0o077
    proc = childproc.start([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert os.getsid(proc.pid) == proc.pid != os.getsid(0)
    finally:
        childproc.stop_group(proc, grace=1.0)


@pytest.mark.parametrize("die_with_parent", [True, False])
def test_a_child_started_to_die_with_its_parent_does_when_the_parent_is_killed(die_with_parent):
    """The parent (a Python process) starts a sleeper through childproc.start and is then SIGKILLed: the sleeper
    gets SIGTERM from the kernel with die_with_parent, and lives on without it (the control case)."""
    parent_code = textwrap.dedent(f"""
        import sys, time
        from wide_export.base import childproc
        child = childproc.start([sys.executable, "-c", "import time; time.sleep(60)"],
                                die_with_parent={die_with_parent})
        print(child.pid, flush=True)
        time.sleep(60)
    """)
    parent = subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    try:
        assert _alive(child)
        parent.kill()
        parent.wait(10)
        assert _gone_within(child, 10.0) is die_with_parent
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)


def test_stop_group_stops_the_grandchildren_too():
    proc = childproc.start(["sh", "-c", "sleep 60 & sleep 60 & wait"])
    time.sleep(0.3)
    members = childproc._group_members(proc.pid)
    assert len(members) >= 3  # the shell and its two sleepers
    childproc.stop_group(proc, grace=2.0)
    assert not childproc._group_members(proc.pid) and all(not _alive(pid) for pid in members)


def test_the_tensorrt_child_runs_a_function_and_returns_its_json():
    """trt/_child.run_in_child on the helper: a module:function called with keyword arguments in a child
    Python, its JSON result returned; a WideError there is one here."""
    from wide_export.base.errors import WideError
    from wide_export.trt._child import run_in_child

    assert run_in_child("json:dumps", {"obj": [1, 2]}, dict(os.environ)) == "[1, 2]"
    with pytest.raises(WideError, match="unknown --preset nope"):
        run_in_child("wide_export.bench.generate:run_generate_bench", {"preset": "nope"}, dict(os.environ))


def test_the_death_signal_and_the_umask_are_set_in_the_child_itself():
    """What the child runs between fork and exec, read back by the child (prctl PR_GET_PDEATHSIG = 2)."""
    code = ("import ctypes, os; v = ctypes.c_int(); ctypes.CDLL(None).prctl(2, ctypes.byref(v)); "
            "print(v.value, os.umask(0))")
    before = os.umask(0o022)
    os.umask(before)
    for kwargs, want in (({"die_with_parent": True, "umask": 0o027}, [int(signal.SIGTERM), 0o027]),
                         ({"die_with_parent": True}, [int(signal.SIGTERM), before]),
                         ({"umask": 0o077}, [0, 0o077]), ({}, [0, before])):
        proc = childproc.start([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, **kwargs)
        out, _ = proc.communicate(timeout=30)
        assert [int(v) for v in out.split()] == want, kwargs
