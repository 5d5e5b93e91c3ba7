"""`wide-export serve` against faults on a real tritonserver (127.0.0.1): a python-backend stub
killed with SIGKILL is noticed and tritonserver restarted within 30 s (Triton alone keeps
answering ready while every request fails); a model that cannot come back stops `serve` with
one line and exit 2; the dead stubs' shared memory is gone once `serve` stops; repository
paths with spaces and non-ASCII characters are served.

Stub processes and shared-memory regions are found here by reading /proc directly, not with
the code under test.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.triton import tiny_llm

CLI = [sys.executable, "-c", "from wide_export.cli import main; main()"]
STUB = "triton_python_backend_stub"
DETECT_LIMIT_S = 30.0

pytestmark = pytest.mark.usefixtures("tritonserver_available")


def _stubs_of(model_py: Path) -> dict[int, list[str]]:
    """Live stub processes running `model_py`: pid -> argv."""
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            if not entry.name.isdigit():
                continue
            if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            argv = [a.decode() for a in (entry / "cmdline").read_bytes().split(b"\0")]
        except OSError:
            continue
        if len(argv) > 1 and argv[0].endswith(STUB) and argv[1] == str(model_py):  # only our own server's
            found[int(entry.name)] = argv
    return found


def _start_serve(repo: Path) -> tuple[subprocess.Popen, str, list[str]]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="200")
    proc = subprocess.Popen(CLI + ["serve", "--repository", str(repo), "--timeout", "60"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines, deadline = [], time.monotonic() + 90
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith("ready"):
            return proc, line.split("gRPC ")[1].split()[0], lines
    proc.kill()
    raise AssertionError("serve did not get ready:\n" + "".join(lines) + proc.stdout.read())


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM first: `serve` then stops its tritonserver (a SIGKILL would orphan it)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _wait_stub(model_py: Path, not_pid: int | None = None, timeout: float = 30.0) -> tuple[int, list[str]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stubs = {p: a for p, a in _stubs_of(model_py).items() if p != not_pid}
        if stubs:
            return next(iter(stubs.items()))
        time.sleep(0.1)
    raise AssertionError(f"no stub for {model_py}")


def _repo(tiny, tmp_path: Path, name: str = "repo") -> Path:
    from wide_export.tritonserver import generate_repository

    return generate_repository(tmp_path / name, onnx=tiny[0])


def test_a_killed_stub_restarts_the_server_within_30_s_and_its_shared_memory_removed(tiny, tmp_path, rng):
    from wide_export.tritonserver.client import GenerationClient

    repo = _repo(tiny, tmp_path)
    model_py = repo / "wide_llm" / "1" / "model.py"
    proc, grpc, _ = _start_serve(repo)
    try:
        prompt = rng.integers(0, tiny_llm.VOCAB, size=5)
        want = tiny_llm.reference_greedy(tiny[1], prompt, 4)
        old_pid, old_argv = _wait_stub(model_py)
        regions = {old_argv[2]}
        assert (Path("/dev/shm") / old_argv[2]).exists()
        with GenerationClient(grpc, "grpc") as client:
            np.testing.assert_array_equal(client.generate(prompt, 4), want)
            os.kill(old_pid, signal.SIGKILL)
            killed = time.monotonic()
            last = None
            while time.monotonic() - killed < DETECT_LIMIT_S:
                try:
                    got = client.generate(prompt, 4)
                    break
                except Exception as err:  # noqa: BLE001 - "not healthy" until restarted
                    last = err
                    time.sleep(0.1)
            else:
                raise AssertionError(f"still failing {DETECT_LIMIT_S} s after the kill: {last}")
            recovered = time.monotonic() - killed
            np.testing.assert_array_equal(got, want)
        print(f"recovered {recovered:.2f} s after SIGKILL of the stub")
        new_pid, new_argv = _wait_stub(model_py, not_pid=old_pid)
        regions.add(new_argv[2])
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
        assert proc.returncode == 130, rest  # 128 + SIGINT, as for every command
        assert "wide_llm" in rest and "restarted" in rest, rest
        left = [r for r in regions if (Path("/dev/shm") / r).exists()]
        assert not left, f"shared memory left behind: {left}"
    finally:
        _stop(proc)


def test_a_model_that_cannot_come_back_stops_serve_with_one_line(tiny, tmp_path):
    repo = _repo(tiny, tmp_path)
    model_py = repo / "wide_llm" / "1" / "model.py"
    proc, _, _ = _start_serve(repo)
    try:
        pid, _ = _wait_stub(model_py)
        model_py.write_text(model_py.read_text().replace(
            "    def initialize(self, args: dict) -> None:\n",
            "    def initialize(self, args: dict) -> None:\n        raise RuntimeError('broken on reload')\n", 1))
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        out, _ = proc.communicate(timeout=DETECT_LIMIT_S + 30)
        took = time.monotonic() - killed
        assert proc.returncode == 2, out
        assert took < DETECT_LIMIT_S, f"took {took:.1f} s"
        errors = [ln for ln in out.splitlines() if ln.startswith("error:")]
        assert len(errors) == 1 and "wide_llm" in errors[0] and "hint:" in errors[0], out
        assert "Traceback" not in out
    finally:
        _stop(proc)


def test_serve_gives_up_when_a_model_keeps_dying(tiny, tmp_path):
    from wide_export.base.errors import WideError
    from wide_export.tritonserver import TritonServer

    repo = _repo(tiny, tmp_path)
    model_py = repo / "wide_llm" / "1" / "model.py"
    server = TritonServer(repo, max_reloads=1).start(timeout=60)
    try:
        # There is no model control: an unload from anyone is refused, the model stays.
        import urllib.error
        import urllib.request

        direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        base = f"http://{server.endpoints.http}"
        with pytest.raises(urllib.error.HTTPError) as refused:
            direct.open(urllib.request.Request(f"{base}/v2/repository/models/wide_llm/unload", data=b"{}",
                                               method="POST"), timeout=10)
        assert refused.value.code >= 400, refused.value.code  # 503: model control is not enabled
        assert direct.open(f"{base}/v2/models/wide_llm/ready", timeout=10).status == 200
        events: list[str] = []
        pid, _ = _wait_stub(model_py)
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + DETECT_LIMIT_S
        while not any("restarted" in e for e in events) and time.monotonic() < deadline:
            server.watch_models(events.append)
            time.sleep(0.1)
        assert any("restarted" in e for e in events), events
        pid2, _ = _wait_stub(model_py, not_pid=pid)
        os.kill(pid2, signal.SIGKILL)
        with pytest.raises(WideError, match="giving up"):
            while time.monotonic() < deadline + DETECT_LIMIT_S:
                server.watch_models(events.append)
                time.sleep(0.1)
    finally:
        server.stop()


@pytest.mark.parametrize("name", ["my repo", "répertoire ñ", "a'b $x;c"])
def test_repository_paths_with_spaces_and_non_ascii_are_served(tiny, tmp_path, rng, name):
    from typer.testing import CliRunner

    from wide_export.cli import app
    from wide_export.tritonserver import TritonServer
    from wide_export.tritonserver.client import GenerationClient

    repo = tmp_path / name / "repo"
    result = CliRunner().invoke(app, ["triton", "--onnx", str(tiny[0]), "--output", str(repo)])
    assert result.exit_code == 0, result.output
    prompt = rng.integers(0, tiny_llm.VOCAB, size=4)
    with TritonServer(repo).start(timeout=30) as server:
        with GenerationClient(server.endpoints.grpc, "grpc") as client:
            np.testing.assert_array_equal(client.generate(prompt, 3), tiny_llm.reference_greedy(tiny[1], prompt, 3))


def test_a_stub_that_died_before_the_first_look_is_noticed_too(tiny, tmp_path, rng):
    from wide_export.tritonserver import TritonServer
    from wide_export.tritonserver.client import GenerationClient

    repo = _repo(tiny, tmp_path)
    model_py = repo / "wide_llm" / "1" / "model.py"
    with TritonServer(repo).start(timeout=60) as server:
        pid, _ = _wait_stub(model_py)
        os.kill(pid, signal.SIGKILL)
        server._stubs = {}  # as if it had died between the load and the first snapshot
        events: list[str] = []
        deadline = time.monotonic() + DETECT_LIMIT_S
        while not events and time.monotonic() < deadline:
            server.watch_models(events.append)
            time.sleep(0.1)
        assert any("restarted" in e for e in events), events
        prompt = rng.integers(0, tiny_llm.VOCAB, size=4)
        with GenerationClient(server.endpoints.grpc, "grpc") as client:
            np.testing.assert_array_equal(client.generate(prompt, 3), tiny_llm.reference_greedy(tiny[1], prompt, 3))
