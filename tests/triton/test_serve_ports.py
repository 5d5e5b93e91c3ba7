"""`serve` on ports another server holds: refused before anything starts, naming
who holds the port, and a readiness answer from another server is never taken for ours."""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from wide_export.base.errors import WideError
from wide_export.tritonserver import TritonServer
from wide_export.tritonserver import ports

CLI = [sys.executable, "-c", "from wide_export.cli import main; main()"]


class _Ready(http.server.BaseHTTPRequestHandler):
    """Another server: answers every GET with 200, as a ready Triton would."""

    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def other_server():
    """An HTTP server on a loopback port that says 'ready' to anything (in this process)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ready)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.fixture
def listener():
    """A plain listening socket in a child process (pid, port): someone else's server."""
    proc = subprocess.Popen([sys.executable, "-c", (
        "import socket, sys, time\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
        "print(s.getsockname()[1], flush=True); time.sleep(120)\n")], stdout=subprocess.PIPE, text=True)
    port = int(proc.stdout.readline())
    yield proc.pid, port
    proc.kill()
    proc.wait()


def test_holders_names_the_process_listening_on_a_port(listener):
    pid, port = listener
    found = ports.holders(port)
    assert len(found) == 1 and found[0].startswith(f"{pid} (python"), found
    assert ports.owns_port([pid], port)
    assert not ports.owns_port([os.getpid()], port)


def test_a_port_nobody_listens_on_is_owned_by_nobody():
    with socket.socket() as sock:  # bound but not listening: not a server
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        assert ports.holders(port) == []
        assert not ports.owns_port([os.getpid()], port)


def test_check_ports_free_names_flag_port_and_holder(listener):
    pid, port = listener
    ports.check_ports_free("127.0.0.1", {"--http-port": None, "--grpc-port": ports_free_port()})
    with pytest.raises(WideError) as err:
        ports.check_ports_free("127.0.0.1", {"--grpc-port": ports_free_port(), "--http-port": port})
    text = err.value.message
    assert text.startswith(f"--http-port {port} ") and f" {pid} (" in text, text  # flag, port and holder
    assert "--http-port" in err.value.hint
    same = ports_free_port()
    with pytest.raises(WideError, match=f"^--grpc-port {same} .*--http-port"):
        ports.check_ports_free("127.0.0.1", {"--http-port": same, "--grpc-port": same})


def ports_free_port() -> int:
    from wide_export.tritonserver.server import free_port

    return free_port()


def test_serve_on_a_taken_port_is_one_line_naming_the_holder_and_starts_nothing(tiny_repo, listener):
    pid, port = listener
    done = subprocess.run([*CLI, "serve", "--repository", str(tiny_repo), "--http-port", str(port)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"--http-port {port} " in lines[0] and f" {pid} (" in lines[0], lines[0]
    assert "ready" not in done.stdout


def test_a_taken_port_is_named_before_tritonserver_is_started(tiny_repo, listener, monkeypatch):
    """Before anything starts: not found out from a tritonserver that failed to bind (whose retry path would
    name the holder too, so the CLI test above cannot tell the two apart)."""
    pid, port = listener
    monkeypatch.setattr(TritonServer, "_start_once", lambda *a, **k: pytest.fail("tritonserver was started"))
    with pytest.raises(WideError, match=f"^--http-port {port} .* {pid} "):
        TritonServer(tiny_repo, http_port=port).start(timeout=5)


def test_serve_refuses_the_openai_port_given_to_another_endpoint(tiny_repo):
    port = ports_free_port()
    done = subprocess.run([*CLI, "serve", "--repository", str(tiny_repo), "--grpc-port", str(port),
                           "--openai-port", str(port)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "also given to another endpoint" in done.stderr, done.stderr


def test_another_servers_readiness_is_not_taken_for_ours(tmp_path, other_server):
    """Our server never binds (a stand-in process that does nothing); another server on the HTTP port
    answers ready: wait_ready must not return, the start times out instead of reporting ready."""
    server = TritonServer(tmp_path, http_port=other_server)
    server.process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert server.is_ready()  # the probe alone is fooled
        started = time.monotonic()
        with pytest.raises(WideError, match="not ready after 1 s"):
            server.wait_ready(timeout=1.0)
        assert time.monotonic() - started >= 1.0
    finally:
        server.process.kill()
        server.process.wait()


def test_our_own_listener_is_ready(tmp_path, other_server):
    """The same probe passes when the process we started is the one listening (here: this process)."""
    server = TritonServer(tmp_path, http_port=other_server)

    class Me:
        pid = os.getpid()

        @staticmethod
        def poll():
            return None

    server.process = Me()
    server.wait_ready(timeout=5.0)
