"""`wide-export triton` and `wide-export serve` driven as real commands, and the
server launcher's failure modes (no binary, a model that fails, a model stuck loading)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from wide_export.base.errors import WideError
from wide_export.tritonserver import TritonServer, generate_repository
from wide_export.tritonserver.client import GenerationClient

from tests.triton import tiny_llm
from tests.helpers import assert_one_line_error

CLI = [sys.executable, "-c", "from wide_export.cli import main; main()"]


def _app():
    from wide_export.cli import app

    return app


def test_triton_command_writes_a_repository_and_refuses_to_overwrite(tiny, tmp_path):
    runner = CliRunner()
    out = tmp_path / "repo"
    result = runner.invoke(_app(), ["triton", "--onnx", str(tiny[0]), "--output", str(out), "--max-batch", "2"])
    assert result.exit_code == 0, result.output
    assert (out / "wide_llm" / "config.pbtxt").is_file() and (out / "wide_llm" / "1" / "model.py").is_file()
    assert "max_batch_size: 2" in (out / "wide_llm" / "config.pbtxt").read_text()
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    again = runner.invoke(_app(), ["triton", "--onnx", str(tiny[0]), "--output", str(out)])
    assert_one_line_error(again)
    assert "not empty" in again.output and "Traceback" not in again.output
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before


def test_serve_without_any_server_binary_is_a_clear_error(tiny_repo, monkeypatch):
    import wide_export.tritonserver.server as server_mod

    monkeypatch.setattr(server_mod.shutil, "which", lambda name: None)
    monkeypatch.setattr(server_mod, "find_spec", lambda name: None)
    with pytest.raises(WideError, match="no tritonserver binary"):
        server_mod.find_tritonserver()
    result = CliRunner().invoke(_app(), ["serve", "--repository", str(tiny_repo)])
    assert "no tritonserver binary" in assert_one_line_error(result)


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_serve_command_answers_then_stops_on_ctrl_c(tiny, tiny_repo, rng, sig, code):
    """Once ready, Ctrl-C / SIGTERM exit 130 / 143 as for every command (they exited 0)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="200")
    from wide_export.tritonserver.server import free_port

    proc = subprocess.Popen(CLI + ["serve", "--repository", str(tiny_repo), "--timeout", "60",
                                  "--metrics-port", str(free_port())],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        lines, deadline = [], time.monotonic() + 90
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("ready"):
                break
        assert lines and lines[-1].startswith("ready"), "".join(lines)
        grpc = lines[-1].split("gRPC ")[1].split()[0]
        assert grpc.startswith("127.0.0.1:") and "metrics http://127.0.0.1:" in lines[-1]
        prompt = rng.integers(0, tiny_llm.VOCAB, size=6)
        with GenerationClient(grpc, "grpc") as client:
            np.testing.assert_array_equal(client.generate(prompt, 5), tiny_llm.reference_greedy(tiny[1], prompt, 5))
        proc.send_signal(sig)
        rest, _ = proc.communicate(timeout=40)
        assert proc.returncode == code, rest  # 128 + the signal once ready, as for every command (README)
        assert f"stopped ({sig.name})" in rest and "Traceback" not in rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def _free_range(n: int) -> int:
    """A port p with p..p+n-1 all free on 127.0.0.1 right now."""
    import socket

    from wide_export.tritonserver.server import free_port

    while True:
        base = free_port()
        if base + n > 65535:
            continue
        try:
            socks = []
            for p in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()


def test_bench_serving_reports_both_paths(tiny, tmp_path, monkeypatch):
    """--base-port puts tritonserver's ports at base..base+2 (it opened random ones)."""
    import wide_export.tritonserver.server as server_mod

    out = tmp_path / "serving.json"
    base = _free_range(4)
    ports = []
    real_start = server_mod.TritonServer.start

    def spy(self, *a, **k):
        started = real_start(self, *a, **k)
        ports.append((self.endpoints.http, self.endpoints.grpc, self.endpoints.metrics))
        return started

    monkeypatch.setattr(server_mod.TritonServer, "start", spy)
    result = CliRunner().invoke(_app(), [
        "bench", "serving", "--onnx", str(tiny[0]), "--requests", "2", "--prompt-len", "4", "--new-tokens", "3",
        "--protocol", "http", "--output", str(out), "--staggered", "4", "--arrival-ms", "5", "--rounds", "2",
        "--base-port", str(base)])
    assert result.exit_code == 0, result.output
    assert len(ports) == 3  # the measured server, then static and in-flight batching
    assert set(ports) == {(f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}", f"http://127.0.0.1:{base + 2}/metrics")}
    import json

    from wide_export.bench.serving import ServingBenchConfig, staggered_plan

    report = json.loads(out.read_text())
    rows = report["results"]
    assert sorted((r["name"], r["clients"]) for r in rows) == [
        ("direct onnxruntime", 1), ("direct onnxruntime", 8), ("direct onnxruntime, batched", 8),
        ("triton http", 1), ("triton http", 8)]
    for r in rows:  # two rounds of 2 requests per client, pooled
        assert r["requests"] == 2 * 2 * r["clients"] and r["tokens"] == 3 * r["requests"]
        assert 0 < r["p50_ms"] <= r["p99_ms"] and r["tokens_per_s"] > 0
        assert len(r["round_tokens_per_s"]) == 2
        assert r["tokens_per_s"] == pytest.approx(r["tokens"] / r["wall_s"], rel=1e-2)  # wall_s: rounded to 1 us
        best = max(d["tokens_per_s"] for d in rows if d["name"].startswith("direct") and d["clients"] == r["clients"])
        assert r["tokens_per_s_vs_best_direct"] == pytest.approx(r["tokens_per_s"] / best, abs=1e-3)
    plan = staggered_plan(ServingBenchConfig(prompt_len=4, new_tokens=3, staggered=4, arrival_ms=5), 61, 64)
    assert [r["name"] for r in report["staggered"]] == ["static batching", "inflight batching"]
    for r in report["staggered"]:
        assert r["requests"] == 4 and r["tokens"] == sum(n for _, _, n in plan) and r["tokens_per_s"] > 0
        assert 0 < r["first_token_p50_ms"] <= r["p50_ms"] <= r["p99_ms"]
    assert "staggered arrivals" in result.output
    # The table says what it compares, and both paths run ONNX Runtime with the same threads.
    import os

    assert "IOBinding" in report["compares"] and "dynamic batcher" in report["compares"]
    assert report["intra_op_threads"] == max(1, os.cpu_count() or 1)
    assert "same intra-op threads as the server's instance" in " ".join(result.output.split())


def test_serve_until_sigterm_stops_the_server_cleanly(tiny_repo):
    import threading

    before = signal.getsignal(signal.SIGTERM)
    server = TritonServer(tiny_repo).start(timeout=60)
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    started = time.monotonic()
    try:
        server.serve_until_signal(poll=0.1)  # returns once SIGTERM arrives, after stopping the server
    finally:
        timer.cancel()
        server.stop()
    assert server.process.returncode == 0
    assert time.monotonic() - started < 30
    assert signal.getsignal(signal.SIGTERM) == before  # our handler was removed again


def _broken_repo(tiny_folder: Path, tmp_path: Path, initialize: str) -> Path:
    repo = generate_repository(tmp_path / "repo", onnx=tiny_folder)
    model_py = repo / "wide_llm" / "1" / "model.py"
    text = model_py.read_text().replace(
        "    def initialize(self, args: dict) -> None:\n",
        f"    def initialize(self, args: dict) -> None:\n        {initialize}\n", 1)
    model_py.write_text(text)
    return repo


def test_a_model_that_fails_to_load_stops_the_start_with_its_log(tiny, tmp_path):
    repo = _broken_repo(tiny[0], tmp_path, "raise RuntimeError('deliberately broken model')")
    server = TritonServer(repo)
    with pytest.raises(WideError, match="exited with code") as err:
        server.start(timeout=60)
    assert "deliberately broken model" in str(err.value)
    assert server.process.poll() is not None


def test_a_model_stuck_loading_times_out(tiny, tmp_path):
    repo = _broken_repo(tiny[0], tmp_path, "import time; time.sleep(600)")
    server = TritonServer(repo)
    start = time.monotonic()
    with pytest.raises(WideError, match="not ready after 3 s"):
        server.start(timeout=3)
    assert server.process.poll() is not None  # stopped, not left behind
    assert time.monotonic() - start < 40


def test_serve_refuses_bad_ports_and_an_empty_repository(tiny_repo, tmp_path):
    runner = CliRunner()
    result = runner.invoke(_app(), ["serve", "--repository", str(tiny_repo), "--http-port", "70000"])
    assert "not a TCP port" in assert_one_line_error(result)
    (tmp_path / "empty").mkdir()
    result = runner.invoke(_app(), ["serve", "--repository", str(tmp_path / "empty")])
    assert "holds no model" in assert_one_line_error(result)


def test_repository_is_created_with_normal_permissions(tiny, tmp_path):
    out = generate_repository(tmp_path / "repo", onnx=tiny[0])
    mask = os.umask(0)
    os.umask(mask)
    assert out.stat().st_mode & 0o777 == 0o777 & ~mask


def _processes_mentioning(text: str) -> list[int]:
    """Pids whose command line contains `text` (Linux /proc)."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and text in (entry / "cmdline").read_bytes().decode(errors="replace"):
                pids.append(int(entry.name))
        except OSError:
            pass
    return pids


def test_sigterm_while_loading_stops_the_server(tiny, tmp_path):
    """`kill` of `wide-export serve` during the start must not leave tritonserver running."""
    repo = _broken_repo(tiny[0], tmp_path, "import time; time.sleep(600)")
    proc = subprocess.Popen(CLI + ["serve", "--repository", str(repo), "--timeout", "120"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while not _processes_mentioning(f"--model-repository={repo}") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _processes_mentioning(f"--model-repository={repo}"), "tritonserver did not start"
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 143, out  # 128 + SIGTERM, as for every command
        assert "Traceback" not in out
        deadline = time.monotonic() + 10
        while _processes_mentioning(f"--model-repository={repo}") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _processes_mentioning(f"--model-repository={repo}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_kill_9_of_serve_takes_tritonserver_and_its_stub_down(tiny_repo, tmp_path):
    """`kill -9` of `wide-export serve` left tritonserver and its Python stub serving as
    orphans (the next serve found the ports taken). They now get SIGTERM when serve dies, however it dies,
    and the stub's shared-memory region, 0600 now, is removed with it."""
    import shutil

    repo = tmp_path / "repo"
    shutil.copytree(tiny_repo, repo)
    (tmp_path / "t").mkdir()  # the work folder a killed serve cannot remove stays in pytest's folder, not /tmp
    proc = subprocess.Popen(CLI + ["serve", "--repository", str(repo), "--timeout", "60"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "TMPDIR": str(tmp_path / "t")})
    try:
        deadline = time.monotonic() + 90
        for line in proc.stdout:
            if line.startswith("ready") or time.monotonic() > deadline:
                break
        server = _processes_mentioning(f"--model-repository={repo}")
        assert server, "tritonserver did not start"
        stubs = [p for p in _processes_mentioning("triton_python_backend_stub") if _parent_of(p) in server]
        assert stubs, "no Python stub under tritonserver"
        regions = [Path("/dev/shm") / _argv(p)[2] for p in stubs]  # the stub's argv[2]: its region's name
        for region in regions:  # item 2: another local user read the requests' prompts from a 0644 region
            assert region.stat().st_mode & 0o077 == 0, f"{region} is {oct(region.stat().st_mode & 0o777)}"
        proc.kill()  # SIGKILL: serve runs no handler, no finally
        proc.wait(10)
        deadline = time.monotonic() + 30
        alive = server + stubs
        while alive and time.monotonic() < deadline:
            time.sleep(0.2)
            alive = [p for p in alive if Path(f"/proc/{p}").exists() and _state(p) != "Z"]
        assert not alive, f"still running after serve was killed: {alive}"
        assert not [r for r in regions if r.exists()], "shared memory left behind"
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in _processes_mentioning(f"--model-repository={repo}"):
            os.kill(pid, signal.SIGKILL)


def _argv(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")


def _parent_of(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return -1


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"
