"""Keep a served repository answering: notice a dead or hung tritonserver or python-backend stub
and restart tritonserver, with a bounded number of restarts and a growing pause between them.

Why a restart of the whole server and not a model reload: a reload needs Triton's model
control API, which anyone who can reach the port can call (it loads `model.py` files: code);
Triton can guard it only with a key on its command line, readable by every local user in
/proc/PID/cmdline. So `serve` runs tritonserver without model control (`--model-control-mode
none`), and recovers by restarting it on the same ports (a few seconds for our models).

What counts as broken (checked every `poll` seconds by `Supervisor.check`):
- tritonserver exited (a crash, e.g. a request its JSON parser could not take);
- a python-backend stub died (Triton itself keeps answering ready while every request fails);
- a stub is hung: stopped (SIGSTOP, state T in /proc) for two checks in a row, or a probe
  inference (one token, sent only when the stub used no CPU for `probe_every` seconds) got no
  answer within `probe_timeout` while the stub still used no CPU. A stub that is busy
  generating uses CPU and is never probed. Probes carry the request parameter `wide_probe`,
  which the generation model leaves out of its LLM metrics.
While the server restarts it answers nothing (health is not ready); open streams end with an
error or a closed connection, never a silent stall.
"""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path
from typing import Callable, Optional

from wide_export.base.errors import WideError

PROBE_PARAMETER = "wide_probe"


def stub_state(pid: int) -> Optional[tuple[str, int]]:
    """(state letter, CPU ticks used) of a process from /proc, or None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[11]) + int(fields[12])  # state, utime + stime


def probe(grpc_url: str, model: str, timeout: float) -> Optional[str]:
    """Ask `model` for one token; None when it answered within `timeout`, else why not."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    answers: queue.Queue = queue.Queue()
    client = None
    try:
        client = grpcclient.InferenceServerClient(grpc_url)  # may refuse the URL: a failed probe too
        client.start_stream(callback=lambda result, error: answers.put(error), stream_timeout=timeout)
        ids = grpcclient.InferInput("input_ids", [1, 1], "INT64")
        ids.set_data_from_numpy(np.zeros((1, 1), np.int64))
        new = grpcclient.InferInput("max_new_tokens", [1, 1], "INT32")
        new.set_data_from_numpy(np.ones((1, 1), np.int32))
        client.async_stream_infer(model, [ids, new], outputs=[grpcclient.InferRequestedOutput("output_ids")],
                                  parameters={PROBE_PARAMETER: True})
        try:
            error = answers.get(timeout=timeout)
        except queue.Empty:
            return f"no answer to a one-token request within {timeout:.0f} s"
        return None if error is None else f"a one-token request failed: {error}"
    except Exception as err:  # noqa: BLE001 - an unreachable server is a failed probe
        return f"a one-token request failed: {err}"
    finally:
        try:
            if client is not None:
                client.stop_stream(cancel_requests=True)
                client.close()
        except Exception:  # noqa: BLE001
            pass


class Supervisor:
    """Watches one TritonServer; `check()` restarts it when something above is broken."""

    def __init__(self, server, report: Callable[[str], None] = print, probe_every: float = 5.0,
                 probe_timeout: float = 10.0, probe_fn: Callable[[str, str, float], Optional[str]] = probe):
        self.server, self.report = server, report
        self.probe_every, self.probe_timeout, self.probe_fn = probe_every, probe_timeout, probe_fn
        self._stopped: dict[int, int] = {}  # stub pid -> checks in a row it was found stopped
        self._cpu: dict[int, tuple[int, float]] = {}  # stub pid -> (CPU ticks, since when unchanged)
        self._probe: Optional[threading.Thread] = None
        self._probe_result: Optional[tuple[str, str, dict]] = None  # (model, failure, CPU ticks at the start)

    def check(self) -> Optional[str]:
        """One look; returns why the server was restarted (None when all was well)."""
        server = self.server
        if server.process is None or server.process.poll() is not None:
            code = None if server.process is None else server.process.returncode
            return self._restart(f"tritonserver exited unexpectedly (code {code})")
        current = server._current_stubs()
        dead = [stub for pid, stub in server._stubs.items() if pid not in current]
        orphans = server.python_models() - {stub.model for stub in current.values()}
        if dead or orphans:
            names = ", ".join(f"{s.instance} (pid {s.pid})" for s in dead) or "(all stubs)"
            models = ", ".join(sorted({s.model for s in dead} | orphans))
            return self._restart(f"model {models}: backend process {names} died")
        server._stubs = current
        hung = self._hung(current)
        if hung:
            return self._restart(hung)
        return None

    def _hung(self, stubs: dict) -> Optional[str]:
        now = time.monotonic()
        for pid, stub in stubs.items():
            state = stub_state(pid)
            if state is None:
                continue
            self._stopped[pid] = self._stopped.get(pid, 0) + 1 if state[0] in "Tt" else 0
            if self._stopped[pid] >= 2:
                return f"model {stub.model}: backend process {stub.instance} (pid {pid}) is stopped"
            ticks, since = self._cpu.get(pid, (state[1], now))
            self._cpu[pid] = (state[1], since if ticks == state[1] else now)
        if self._probe_result is not None:
            model, failure, ticks = self._probe_result
            self._probe_result = None
            idle = all((stub_state(pid) or ("", -1))[1] == t for pid, t in ticks.items())
            if failure and idle:
                return f"model {model}: backend process is hung ({failure})"
        if self._probe is None or not self._probe.is_alive():
            # only stubs read above: one that went between the listing and /proc has no CPU record
            # (the next check finds it dead)
            seen = {pid: stub for pid, stub in stubs.items() if pid in self._cpu}
            quiet = [stub for pid, stub in seen.items() if now - self._cpu[pid][1] >= self.probe_every]
            if quiet:
                self._start_probe(quiet[0].model, {pid: self._cpu[pid][0] for pid in seen})
        return None

    def _start_probe(self, model: str, ticks: dict) -> None:
        url = self.server.endpoints.grpc

        def run() -> None:
            self._probe_result = (model, self.probe_fn(url, model, self.probe_timeout), ticks)

        for pid in ticks:  # the next probe waits for another quiet spell
            self._cpu[pid] = (self._cpu[pid][0], time.monotonic())
        self._probe = threading.Thread(target=run, name="wide-probe", daemon=True)
        self._probe.start()

    def _restart(self, why: str) -> str:
        server = self.server
        now = time.monotonic()
        server.reloads = [t for t in server.reloads if now - t < server.reload_window] + [now]
        if len(server.reloads) > server.max_reloads:
            raise WideError(f"{why}, the {len(server.reloads)}th failure in {server.reload_window:.0f} s; giving up",
                            hint="read the server log; a supervisor should restart `wide-export serve`")
        pause = min(2.0 ** (len(server.reloads) - 2), 8.0) if len(server.reloads) > 1 else 0.0
        self.report(f"{why}; restarting tritonserver" + (f" in {pause:.0f} s" if pause else ""))
        time.sleep(pause)
        started = time.monotonic()
        try:
            server.restart()
        except WideError as err:
            raise WideError(f"{why}, and tritonserver could not be restarted: {err.message.splitlines()[0]}",
                            hint="read the server log; fix the repository and run `wide-export serve` again") from None
        self._stopped.clear()
        self._cpu.clear()
        self._probe_result = None
        self.report(f"tritonserver restarted in {time.monotonic() - started:.1f} s; models ready")
        return why
