"""Shared test helpers: tiny WIDE checkpoints written to disk through the real code paths."""

from __future__ import annotations

from pathlib import Path

from wide_export.model.synthetic import SyntheticSpec, write_checkpoint


def make_checkpoint(tmp: Path, **spec_kwargs) -> Path:
    lora = spec_kwargs.pop("lora", False)
    spec = SyntheticSpec(**spec_kwargs)
    return write_checkpoint(Path(tmp), spec, lora=lora)


def assert_one_line_error(result, code: int = 2) -> str:
    """A user error as the CLI must report it: exit `code`, no exception, and stderr exactly one
    line `error: <what> (hint: <how to fix>)` with no traceback. Returns that line.

    `result` is a Click/Typer runner Result or a subprocess.CompletedProcess (text mode).
    """
    if hasattr(result, "returncode"):  # subprocess
        got, everything = result.returncode, result.stdout + result.stderr
    else:
        got, everything = result.exit_code, result.output
        assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert got == code, (got, everything)
    assert "Traceback" not in everything, everything
    lines = result.stderr.splitlines()
    assert len(lines) == 1, f"stderr must be exactly one line, got {len(lines)}:\n{result.stderr}"
    assert lines[0].startswith("error: ") and "(hint: " in lines[0], lines[0]
    return lines[0]


def sigint_default() -> None:
    """preexec_fn for a child a test will Ctrl-C: SIGINT at its default, as under a terminal. A test run started
    in the background (`cmd &` in a script, nohup) inherits SIGINT ignored, and the CLI keeps an inherited
    SIG_IGN on purpose (POSIX convention for background jobs), so without this the child would not see it."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def signal_when_ready(cmd, ready, sig, *, env=None, timeout: float = 240.0, settle: float = 0.0,
                      wait: float = 120.0) -> tuple[int, str]:
    """Start `cmd`, send `sig` once `ready(stderr so far)` is true (then `settle` s later); (returncode, stderr).

    The child starts with SIGINT at its default, as under a terminal: a test run started in the background
    (`cmd &`, nohup) ignores SIGINT, and the CLI keeps an inherited SIG_IGN on purpose. Waits on the
    condition, not on a fixed sleep, so a loaded machine only makes it slower."""
    import signal
    import subprocess
    import threading
    import time

    proc = subprocess.Popen(list(cmd), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=sigint_default)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, "")), daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout
    try:
        while not ready("".join(lines)):
            assert proc.poll() is None, f"finished before the signal: {''.join(lines)}"
            assert time.monotonic() < deadline, f"never got ready: {''.join(lines)}"
            time.sleep(0.01)
        time.sleep(settle)
        assert proc.poll() is None, f"finished before the signal: {''.join(lines)}"
        proc.send_signal(sig)
        proc.wait(timeout=wait)
        reader.join(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, "".join(lines)


def listening_tcp() -> dict[str, str]:
    """inode -> local address (as /proc/net writes it) of every listening TCP socket, IPv4 and IPv6 (Linux).
    Read here, not with wide_export/tritonserver/ports.py, so tests of that code do not lean on it."""
    out = {}
    for table in ("tcp", "tcp6"):
        for line in (Path("/proc/net") / table).read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == "0A":  # LISTEN
                out[cols[9]] = cols[1]
    return out


def socket_inodes(pid: int) -> set[str]:
    """The inodes of the sockets process `pid` holds (empty when it is gone)."""
    import os

    out = set()
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return out
    for fd in fds:
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(target[8:-1])
    return out
