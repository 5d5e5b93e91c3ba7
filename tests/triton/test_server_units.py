"""wide_export/tritonserver/server.py on fakes, in-process (mutation testing): no tritonserver is started.

A fake process (poll/wait/send_signal, recorded calls) stands in for the Popen the module makes, a fake
clock for wait_ready's loop, a fake /proc tree for the stub scan, a fake shared-memory folder for the
cleanup, a loopback http.server (port 0) and a fake opener / tritonclient for the readiness probes.
Every expectation below is written out by hand."""

from __future__ import annotations

import http.server
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import types
import urllib.error
from pathlib import Path
from types import SimpleNamespace

import pytest

import wide_export.tritonserver.server as server_mod
from wide_export.base.errors import WideError
from wide_export.tritonserver import ports
from wide_export.tritonserver.server import ServerBinary, Stub, TritonServer

SIGTERM, SIGKILL = signal.SIGTERM, signal.SIGKILL


# ---------------------------------------------------------------------------------------------- fakes


class FakeProc:
    """A Popen stand-in: records every call; `hang` waits time out before it exits with `code`."""

    def __init__(self, pid: int = 4242, code: int = 0, hang: int = 0, returncode=None):
        self.pid = pid
        self.code = code
        self.hang = hang
        self.returncode = returncode
        self.calls: list[tuple] = []

    def poll(self):
        self.calls.append(("poll",))
        return self.returncode

    def send_signal(self, sig):
        self.calls.append(("send_signal", sig))

    def terminate(self):
        self.calls.append(("terminate",))

    def kill(self):
        self.calls.append(("kill",))

    def wait(self, timeout=None):
        self.calls.append(("wait", timeout))
        if self.hang > 0:
            self.hang -= 1
            raise subprocess.TimeoutExpired("tritonserver", timeout)
        self.returncode = self.code
        return self.code


class Clock:
    """time.monotonic / time.sleep: sleep(s) advances by 0.25 s (exact in binary) and records s."""

    def __init__(self, start: float = 1000.0):
        self.now = start
        self.sleeps: list[float] = []
        self.reads = 0

    def monotonic(self) -> float:
        self.reads += 1
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += 0.25


@pytest.fixture
def killpg(monkeypatch):
    """os.killpg recorded (never a real signal); set .raises to an exception to raise it."""
    calls = []

    def fake(pid, sig):
        calls.append((pid, sig))
        if fake.raises is not None:
            raise fake.raises

    fake.raises = None
    fake.calls = calls
    monkeypatch.setattr(server_mod.os, "killpg", fake)
    return fake


@pytest.fixture
def repo(tmp_path) -> Path:
    """A model repository that passes start()'s checks."""
    root = tmp_path / "repo"
    (root / "wide_llm").mkdir(parents=True)
    (root / "wide_llm" / "config.pbtxt").write_text('backend: "python"\n')
    return root


def make_server(root: Path, **kw) -> TritonServer:
    kw.setdefault("http_port", 8123)
    kw.setdefault("grpc_port", 8124)
    return TritonServer(root, **kw)


@pytest.fixture
def ports_from(monkeypatch):
    """free_port() hands out 40001, 40002, ... and records the address asked for."""
    asked = []

    def fake(address="127.0.0.1"):
        asked.append(address)
        return 40000 + len(asked)

    monkeypatch.setattr(server_mod, "free_port", fake)
    return asked


# ---------------------------------------------------------------------------------------- python_stubs


def _proc_entry(root: Path, name: str, stat: str | None, argv: list[bytes] | None) -> None:
    d = root / name
    d.mkdir()
    if stat is not None:
        (d / "stat").write_text(stat)
    if argv is not None:
        (d / "cmdline").write_bytes(b"\0".join(argv))


def _stub_argv(model_py: bytes, region: bytes, instance: bytes, argv0=b"/opt/tritonserver/backends/python/"
               b"triton_python_backend_stub", extra: bytes = b"x") -> list[bytes]:
    # argv[0] stub, [1] model.py, [2] shm region, [3..7] sizes/pids/..., [8] instance name
    return [argv0, model_py, region, b"1048576", b"1048576", b"4242", extra, b"0", instance]


def test_python_stubs_keeps_only_live_stubs_of_the_server(tmp_path, monkeypatch):
    proc = tmp_path / "proc"
    proc.mkdir()
    good = _stub_argv(b"/r/wide_llm/1/model.py", b"triton_python_backend_shm_region_1", b"wide_llm_0_0")
    order = []

    def entry(name, stat, argv):
        _proc_entry(proc, name, stat, argv)
        order.append(name)

    # every kind of entry that is skipped comes first: a `break` in place of a `continue` loses the stubs
    entry("self", "1 (x) S 4242 7 7", good)  # not a pid
    entry("300", "300 (stub) Z 4242 7 7", good)  # zombie
    entry("301", "301 (stub) X 4242 7 7", good)  # dead
    entry("302", "302 (stub) S 4243 4242 4242", good)  # another parent (its pgrp and session are ours)
    entry("303", "303 stub S 4242 7 7", good)  # no ')' : IndexError
    entry("304", "304 (stub) S notapid 7 7", good)  # ValueError
    entry("305", None, good)  # no stat: OSError
    entry("306", "306 (stub) S 4242 7 7", None)  # no cmdline: OSError
    entry("307", "307 (stub) S 4242 7 7", good[:8])  # 8 arguments: too few
    entry("308", "308 (stub) S 4242 7 7", _stub_argv(b"/r/m/1/model.py", b"r", b"m_0_0",
                                                      argv0=b"/usr/bin/triton_python_backend_stubs"))
    entry("309", "309 (stub) S 4242 7 7", _stub_argv(b"/r/m/1/model.py", b"r", b"m_0_0", argv0=b"/usr/bin/python3"))
    # kept: state S with ')' and spaces in its name, state R with a byte that is not UTF-8 in an argument
    entry("501", "501 (stub) x) S 4242 7 7 0 -1", good)
    entry("502", "502 (triton_python) R 4242 9 9", _stub_argv(
        b"/models/tokenizer/3/model.py", b"triton_python_backend_shm_region_2", b"tokenizer_0_1", extra=b"\xff\xfe"))
    entry("503", "503 (stub) D 4242 7 7", _stub_argv(
        b"/models/other/1/model.py", b"triton_python_backend_shm_region_3", b"other_0_0") + [b"", b""])

    real_path = Path

    def fake_path(*args):
        if args == ("/proc",):
            return SimpleNamespace(iterdir=lambda: [proc / name for name in order])
        return real_path(*args)

    monkeypatch.setattr(server_mod, "Path", fake_path)
    assert server_mod.python_stubs(4242) == {
        501: Stub(501, "wide_llm", "wide_llm_0_0", "triton_python_backend_shm_region_1"),
        502: Stub(502, "tokenizer", "tokenizer_0_1", "triton_python_backend_shm_region_2"),
        503: Stub(503, "other", "other_0_0", "triton_python_backend_shm_region_3"),
    }
    assert server_mod.python_stubs(4243) == {302: Stub(302, "wide_llm", "wide_llm_0_0",
                                                       "triton_python_backend_shm_region_1")}
    assert server_mod.python_stubs(1) == {}


def test_python_stubs_reads_the_real_proc():
    # this process has no stub children: nothing found, nothing raised, on the real /proc
    assert server_mod.python_stubs(os.getpid()) == {}


# ---------------------------------------------------------------------------------- find_tritonserver


def test_the_system_tritonserver_on_path_comes_first(monkeypatch):
    asked = []
    monkeypatch.setattr(server_mod.shutil, "which", lambda name: asked.append(name) or "/opt/triton/bin/tritonserver")
    monkeypatch.setattr(server_mod, "find_spec", lambda name: pytest.fail("pytriton looked up"))
    found = server_mod.find_tritonserver()
    assert found == ServerBinary(path=Path("/opt/triton/bin/tritonserver"), bundled=False)
    assert found.python_backend is None and found.stub is None and found.libs is None
    assert asked == ["tritonserver"]


def _bundled_tree(site: Path, version: str = "3.12") -> Path:
    root = site / "pytriton" / "tritonserver"
    for f in (root / "bin" / "tritonserver", root / "python_backend_stubs" / version / "triton_python_backend_stub",
              root / "backends" / "python" / "libtriton_python.so"):
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("x")
    return root


@pytest.fixture
def no_system_server(monkeypatch):
    monkeypatch.setattr(server_mod.shutil, "which", lambda name: None)
    monkeypatch.setattr(server_mod, "sys", SimpleNamespace(version_info=(3, 12, 4, "final", 0),
                                                           executable=sys.executable))


def test_the_bundled_tritonserver_of_nvidia_pytriton(tmp_path, monkeypatch, no_system_server):
    root = _bundled_tree(tmp_path / "site")
    _bundled_tree(tmp_path / "second")  # only the first search location counts
    asked = []
    spec = SimpleNamespace(submodule_search_locations=[str(tmp_path / "site" / "pytriton"),
                                                       str(tmp_path / "second" / "pytriton")])
    monkeypatch.setattr(server_mod, "find_spec", lambda name: asked.append(name) or spec)
    assert server_mod.find_tritonserver() == ServerBinary(
        path=root / "bin" / "tritonserver", bundled=True, python_backend=root / "backends" / "python",
        stub=root / "python_backend_stubs" / "3.12" / "triton_python_backend_stub",
        libs=tmp_path / "site" / "nvidia_pytriton.libs")
    assert asked == ["pytriton"]


@pytest.mark.parametrize("spec", [None, SimpleNamespace(submodule_search_locations=[]),
                                  SimpleNamespace(submodule_search_locations=None)])
def test_no_binary_at_all(monkeypatch, no_system_server, spec):
    monkeypatch.setattr(server_mod, "find_spec", lambda name: spec)
    with pytest.raises(WideError) as err:
        server_mod.find_tritonserver()
    assert "tritonserver" in err.value.message and "nvidia-pytriton" in err.value.message
    assert ".venv-serve" in err.value.hint and "[triton]" in err.value.hint and "tritonserver on PATH" in err.value.hint


@pytest.mark.parametrize("missing", ["bin/tritonserver", "python_backend_stubs/3.12/triton_python_backend_stub",
                                     "backends/python/libtriton_python.so"])
def test_an_incomplete_bundle_names_what_is_missing(tmp_path, monkeypatch, no_system_server, missing):
    root = _bundled_tree(tmp_path / "site")
    (root / missing).unlink()
    spec = SimpleNamespace(submodule_search_locations=[str(tmp_path / "site" / "pytriton")])
    monkeypatch.setattr(server_mod, "find_spec", lambda name: spec)
    with pytest.raises(WideError) as err:
        server_mod.find_tritonserver()
    assert err.value.message.endswith(f"(missing {root / missing})") and "nvidia-pytriton" in err.value.message
    assert "nvidia-pytriton" in err.value.hint and "3.12" in err.value.hint and "PATH" in err.value.hint


def test_an_incomplete_bundle_names_the_first_missing_piece(tmp_path, monkeypatch, no_system_server):
    root = tmp_path / "site" / "pytriton" / "tritonserver"
    root.mkdir(parents=True)  # nothing in it; a stub exists only for another Python
    _bundled_tree(tmp_path / "site", version="3.11")
    (root / "bin" / "tritonserver").unlink()
    spec = SimpleNamespace(submodule_search_locations=[str(tmp_path / "site" / "pytriton")])
    monkeypatch.setattr(server_mod, "find_spec", lambda name: spec)
    with pytest.raises(WideError) as err:
        server_mod.find_tritonserver()
    assert err.value.message.endswith(f"incomplete (missing {root / 'bin' / 'tritonserver'})")
    (root / "bin" / "tritonserver").write_text("x")
    with pytest.raises(WideError) as err:
        server_mod.find_tritonserver()
    assert err.value.message.endswith(
        f"(missing {root / 'python_backend_stubs' / '3.12' / 'triton_python_backend_stub'})")


# ---------------------------------------------------------------------------------------- free_port


def test_free_port_is_an_unprivileged_port_one_can_bind():
    import socket

    for port in (server_mod.free_port(), server_mod.free_port("127.0.0.1")):
        assert isinstance(port, int) and 1024 < port < 65536
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))


def test_free_port_binds_the_address_given():
    with pytest.raises(OSError):
        server_mod.free_port("192.0.2.1")  # TEST-NET-1: not an address of this machine


# --------------------------------------------------------------------------------- _prepare_backends


def test_prepare_backends_copies_the_backend_and_this_pythons_stub(tmp_path):
    backend = tmp_path / "pb"
    (backend / "sub").mkdir(parents=True)
    (backend / "libtriton_python.so").write_bytes(b"lib")
    (backend / "triton_python_backend_utils.py").write_text("utils")
    (backend / "sub" / "nested.txt").write_text("no")
    os.utime(backend / "libtriton_python.so", (1_000_000, 1_000_000))
    stub = tmp_path / "stubs" / "stub-3.12"
    stub.parent.mkdir()
    stub.write_bytes(b"stub")
    into = tmp_path / "work"
    into.mkdir()
    out = server_mod._prepare_backends(ServerBinary(Path("/x"), True, python_backend=backend, stub=stub), into)
    assert out == into / "backends"
    python_dir = into / "backends" / "python"
    assert sorted(p.name for p in python_dir.iterdir()) == [
        "libtriton_python.so", "triton_python_backend_stub", "triton_python_backend_utils.py"]
    assert (python_dir / "libtriton_python.so").read_bytes() == b"lib"
    assert (python_dir / "triton_python_backend_utils.py").read_text() == "utils"
    assert (python_dir / "triton_python_backend_stub").read_bytes() == b"stub"
    assert (python_dir / "libtriton_python.so").stat().st_mtime == 1_000_000  # copy2: metadata kept
    assert sorted(p.name for p in (into / "backends").iterdir()) == ["python"]
    assert (backend / "libtriton_python.so").exists() and stub.exists()  # copies, the wheel untouched


@pytest.mark.parametrize("which", ["python_backend", "stub"])
def test_prepare_backends_needs_the_bundled_pieces(tmp_path, which):
    (tmp_path / "pb").mkdir()
    (tmp_path / "stub").write_text("s")
    parts = {"python_backend": tmp_path / "pb", "stub": tmp_path / "stub", which: None}
    with pytest.raises(AssertionError):
        server_mod._prepare_backends(ServerBinary(Path("/x"), True, **parts), tmp_path / "w")
    assert not (tmp_path / "w").exists()


# -------------------------------------------------------------------------------- server_environment


@pytest.fixture
def pyenv(monkeypatch, tmp_path):
    """This Python at /opt/py/bin/python3; sysconfig answers from .config (LIBDIR has a libpython .so)."""
    libdir = tmp_path / "lib"
    libdir.mkdir()
    (libdir / "libpython3.12.so").write_text("")
    (libdir / "libpython3.12.a").write_text("")
    config = {"LIBDIR": str(libdir), "LDLIBRARY": "libpython3.12.so"}
    monkeypatch.setattr(server_mod, "sys", SimpleNamespace(executable="/opt/py/bin/python3",
                                                           version_info=sys.version_info))
    monkeypatch.setattr(server_mod, "sysconfig", SimpleNamespace(get_config_var=lambda name: config.get(name)))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.setenv("WIDE_SOMETHING", "kept")
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
    return SimpleNamespace(config=config, libdir=str(libdir))


def test_environment_puts_this_python_first_and_its_libraries_on_the_loader_path(pyenv, monkeypatch):
    monkeypatch.setenv("LD_LIBRARY_PATH", "/old/lib")
    env = server_mod.server_environment(ServerBinary(Path("/t"), True, libs=Path("/site/nvidia_pytriton.libs")))
    assert env["PATH"] == "/opt/py/bin:/usr/bin:/bin"
    assert env["LD_LIBRARY_PATH"] == f"{pyenv.libdir}:/site/nvidia_pytriton.libs:/old/lib"
    assert env["WIDE_SOMETHING"] == "kept"
    assert os.environ["PATH"] == "/usr/bin:/bin" and os.environ["LD_LIBRARY_PATH"] == "/old/lib"  # a copy
    assert env == {**os.environ, "PATH": "/opt/py/bin:/usr/bin:/bin",
                   "LD_LIBRARY_PATH": f"{pyenv.libdir}:/site/nvidia_pytriton.libs:/old/lib"}


def test_environment_of_the_system_server(pyenv):
    env = server_mod.server_environment(ServerBinary(Path("/t"), False))
    assert env["LD_LIBRARY_PATH"] == pyenv.libdir


def test_environment_without_path_or_loader_path(pyenv, monkeypatch):
    monkeypatch.delenv("PATH")
    pyenv.config["LIBDIR"] = None
    env = server_mod.server_environment(ServerBinary(Path("/t"), False))
    assert env["PATH"] == "/opt/py/bin:" + os.defpath  # the system's default after it, not "" (the cwd)
    assert os.defpath and not os.defpath.startswith(":")
    assert "LD_LIBRARY_PATH" not in env


def test_environment_with_an_empty_path(pyenv, monkeypatch):
    monkeypatch.setenv("PATH", "")  # set but empty: also the system's default, not "" (the cwd)
    env = server_mod.server_environment(ServerBinary(Path("/t"), False))
    assert env["PATH"] == "/opt/py/bin:" + os.defpath


@pytest.mark.parametrize("config", [
    {"LDLIBRARY": "libpython3.12.a"},  # a static libpython: nothing to load
    {"LDLIBRARY": None},
    {"LDLIBRARY": "libpython3.12.so.1.0"},
    {"LDLIBRARY": "libpython3.13.so"},  # not there
    {"LIBDIR": None},
    {"LIBDIR": ""},
])
def test_environment_adds_libpython_only_when_its_shared_library_exists(pyenv, monkeypatch, config):
    pyenv.config.update(config)
    monkeypatch.setenv("LD_LIBRARY_PATH", "/old/lib")
    env = server_mod.server_environment(ServerBinary(Path("/t"), True, libs=Path("/libs")))
    assert env["LD_LIBRARY_PATH"] == "/libs:/old/lib"


def test_environment_ignores_an_empty_loader_path(pyenv, monkeypatch):
    monkeypatch.setenv("LD_LIBRARY_PATH", "")
    pyenv.config["LIBDIR"] = None
    assert server_mod.server_environment(ServerBinary(Path("/t"), True, libs=Path("/libs")))["LD_LIBRARY_PATH"] \
        == "/libs"
    assert server_mod.server_environment(ServerBinary(Path("/t"), False))["LD_LIBRARY_PATH"] == ""


# ------------------------------------------------------------------------------------ __init__ / ports


def test_constructor_defaults(tmp_path, monkeypatch, ports_from):
    (tmp_path / "r").mkdir()
    monkeypatch.chdir(tmp_path)
    server = TritonServer("r")
    assert server.repository == tmp_path.resolve() / "r"
    assert (server.http_port, server.grpc_port, server.metrics_port) == (40001, 40002, None)
    assert ports_from == ["127.0.0.1", "127.0.0.1"]
    assert server.address == "127.0.0.1"
    assert server._auto_ports is True
    assert server._asked_ports == {"--http-port": None, "--grpc-port": None, "--metrics-port": None}
    assert server.log_verbose == 0 and server.exit_timeout == 5 and server.extra_args == []
    assert server.max_reloads == 5 and server.reload_window == 600.0 and server.reloads == []
    assert server.http is True
    assert server._supervisor is None and server._stubs == {} and server._shm_regions == set()
    assert server.process is None and server._workdir is None and server.log_path is None
    assert server._final_log == "" and server._served_repository is None and server._python_models is None


def test_constructor_keeps_what_it_is_given(tmp_path, ports_from):
    extra = ("--a", "--b")
    server = TritonServer(tmp_path, http_port=1, grpc_port=65535, metrics_port=9000, address="127.0.0.2",
                          log_verbose=2, exit_timeout=9, extra_args=extra, max_reloads=7, reload_window=30.0)
    assert ports_from == []
    assert (server.http_port, server.grpc_port, server.metrics_port) == (1, 65535, 9000)
    assert server._auto_ports is False
    assert server._asked_ports == {"--http-port": 1, "--grpc-port": 65535, "--metrics-port": 9000}
    assert (server.address, server.log_verbose, server.exit_timeout) == ("127.0.0.2", 2, 9)
    assert server.extra_args == ["--a", "--b"] and isinstance(server.extra_args, list)
    assert (server.max_reloads, server.reload_window) == (7, 30.0)


def test_one_port_given_is_not_auto_and_the_other_is_picked_on_the_address(tmp_path, ports_from):
    server = TritonServer(tmp_path, http_port=8000, address="127.0.0.3")
    assert (server.http_port, server.grpc_port, server._auto_ports) == (8000, 40001, False)
    assert ports_from == ["127.0.0.3"]
    server = TritonServer(tmp_path, grpc_port=8001)
    assert (server.http_port, server.grpc_port, server._auto_ports) == (40002, 8001, False)


def test_without_http_its_port_is_not_asked_for(tmp_path, ports_from):
    server = TritonServer(tmp_path, http_port=8000, grpc_port=8001, http=False)
    assert server.http is False
    assert server._asked_ports == {"--http-port": None, "--grpc-port": 8001, "--metrics-port": None}
    assert server.http_port == 8000


@pytest.mark.parametrize("flag", ["http_port", "grpc_port", "metrics_port"])
@pytest.mark.parametrize("port", [0, -1, 65536, 70000])
def test_a_port_out_of_range_is_refused(tmp_path, ports_from, flag, port):
    with pytest.raises(WideError) as err:
        TritonServer(tmp_path, **{flag: port})
    name = "--" + flag.replace("_", "-")
    assert err.value.message.startswith(f"{name} {port} ") and "TCP port" in err.value.message
    assert "1..65535" in err.value.hint
    assert ports_from == []  # refused before any port is picked


def test_endpoints(tmp_path):
    server = make_server(tmp_path)
    assert server.endpoints == server_mod.Endpoints(http="127.0.0.1:8123", grpc="127.0.0.1:8124", metrics=None)
    server = make_server(tmp_path, metrics_port=8125, address="127.0.0.2")
    assert server.endpoints.metrics == "http://127.0.0.2:8125/metrics"
    assert server.endpoints.http == "127.0.0.2:8123"


# ------------------------------------------------------------------------------------------- command


BIN = ServerBinary(Path("/opt/triton/bin/tritonserver"), False)


def test_command_line_of_a_plain_server(tmp_path):
    server = make_server(tmp_path)
    assert server.command(BIN, None) == [
        "/opt/triton/bin/tritonserver",
        f"--model-repository={tmp_path.resolve()}",
        "--http-address=127.0.0.1", "--http-port=8123",
        "--grpc-address=127.0.0.1", "--grpc-port=8124",
        "--disable-auto-complete-config",
        "--exit-timeout-secs=5",
        "--log-verbose=0",
        "--model-control-mode=none",
        "--http-restricted-api=shared-memory,logging,trace,statistics:wide-refused=\n",
        "--grpc-restricted-protocol=shared-memory,logging,trace,statistics:wide-refused=\n",
        "--allow-metrics=false",
    ]


def test_a_private_grpc_server_listens_on_a_unix_socket_in_a_folder_of_its_own(tmp_path):
    server = TritonServer(tmp_path, http=False, private_grpc=True)
    try:
        cmd = server.command(BIN, None)
        sock = server.endpoints.grpc
        assert sock.startswith("unix:") and sock.endswith("/grpc:1")
        folder = Path(sock[5:]).parent
        assert folder.stat().st_mode & 0o777 == 0o700
        assert f"--grpc-address=unix:{folder}/grpc" in cmd and "--grpc-port=1" in cmd
        assert "--allow-http=false" in cmd and not [a for a in cmd if a.startswith("--http-restricted")]
        assert "--grpc-restricted-protocol=shared-memory,logging,trace,statistics:wide-refused=\n" in cmd
    finally:
        server.stop()
    assert not folder.exists()
    with pytest.raises(ValueError):
        TritonServer(tmp_path, http=True, private_grpc=True)


def test_a_private_grpc_socket_path_too_long_for_unix_is_one_line(tmp_path, monkeypatch):
    deep = tmp_path / ("d" * 90)
    deep.mkdir()
    monkeypatch.setenv("TMPDIR", str(deep))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    server = TritonServer(tmp_path, http=False, private_grpc=True)
    try:
        with pytest.raises(WideError, match="too long for a unix socket") as err:
            server.endpoints
        assert "TMPDIR" in err.value.hint
    finally:
        server.stop()


def test_command_line_with_everything(tmp_path):
    server = make_server(tmp_path, address="127.0.0.2", metrics_port=8125, log_verbose=1, exit_timeout=3,
                         extra_args=["--strict-readiness=true", "--log-info=false"], http=False)
    server._served_repository = Path("/tmp/w/repository")
    assert server.command(BIN, Path("/tmp/w/backends")) == [
        "/opt/triton/bin/tritonserver",
        "--model-repository=/tmp/w/repository",
        "--http-address=127.0.0.2", "--http-port=8123",
        "--grpc-address=127.0.0.2", "--grpc-port=8124",
        "--disable-auto-complete-config",
        "--exit-timeout-secs=3",
        "--log-verbose=1",
        "--model-control-mode=none",
        "--allow-http=false",
        "--grpc-restricted-protocol=shared-memory,logging,trace,statistics:wide-refused=\n",
        "--allow-metrics=true", "--metrics-address=127.0.0.2", "--metrics-port=8125",
        "--backend-directory=/tmp/w/backends",
        "--strict-readiness=true", "--log-info=false",
    ]
    assert server.extra_args == ["--strict-readiness=true", "--log-info=false"]  # not extended by command()


# --------------------------------------------------------------------------------------------- start


@pytest.fixture
def start_env(monkeypatch):
    """find_tritonserver and check_ports_free recorded; start() never reaches a real server."""
    rec = SimpleNamespace(checks=[], finds=0, binary=ServerBinary(Path("/bin/ts"), False), check_raises=[])

    def find():
        rec.finds += 1
        return rec.binary

    def check(address, asked):
        rec.checks.append((address, dict(asked)))
        if rec.check_raises:
            err = rec.check_raises.pop(0)
            if err is not None:
                raise err

    monkeypatch.setattr(server_mod, "find_tritonserver", find)
    monkeypatch.setattr(ports, "check_ports_free", check)
    return rec


def _starts(server, outcomes):
    """server._start_once: one outcome per call (an exception with the log it leaves, or success)."""
    calls = []

    def start_once(binary, timeout):
        calls.append((binary, timeout, server.http_port, server.grpc_port))
        outcome = outcomes[len(calls) - 1]
        if outcome is None:
            return server
        log, err = outcome
        server._final_log = log
        raise err

    server._start_once = start_once
    return calls


def test_start_refuses_a_missing_repository(tmp_path, start_env):
    server = make_server(tmp_path / "nope")
    with pytest.raises(WideError) as err:
        server.start()
    assert f"{tmp_path.resolve() / 'nope'} is not a folder" in err.value.message
    assert "wide-export triton" in err.value.hint
    assert start_env.finds == 0 and start_env.checks == []


def test_start_refuses_a_repository_without_a_model(tmp_path, start_env):
    root = tmp_path / "r"
    (root / "a" / "b").mkdir(parents=True)
    (root / "config.pbtxt").write_text("")  # not in a model folder
    (root / "a" / "b" / "config.pbtxt").write_text("")  # too deep
    server = make_server(root)
    with pytest.raises(WideError) as err:
        server.start()
    assert err.value.message.startswith(f"{root.resolve()} ") and "*/config.pbtxt" in err.value.message
    assert "wide-export triton" in err.value.hint
    assert start_env.finds == 0


def test_start_checks_the_ports_then_starts_once(repo, start_env):
    server = make_server(repo, metrics_port=8125)
    calls = _starts(server, [None])
    assert server.start() is server
    assert start_env.checks == [("127.0.0.1", {"--http-port": 8123, "--grpc-port": 8124, "--metrics-port": 8125})]
    assert calls == [(start_env.binary, 120.0, 8123, 8124)]
    assert start_env.finds == 1


def test_start_returns_what_the_start_returned(repo, start_env):
    server = make_server(repo)
    other = object()
    server._start_once = lambda binary, timeout: other
    assert server.start(timeout=7) is other


def test_start_retries_a_lost_auto_port_with_fresh_ports(repo, start_env, ports_from):
    server = TritonServer(repo)
    lost = ("E bind: Address already in use", WideError("tritonserver exited with code 1"))
    calls = _starts(server, [lost, None])
    assert server.start(timeout=9.5) is server
    assert calls == [(start_env.binary, 9.5, 40001, 40002), (start_env.binary, 9.5, 40003, 40004)]
    assert (server.http_port, server.grpc_port) == (40003, 40004)
    assert len(start_env.checks) == 1  # auto ports: not checked again


def test_start_gives_up_after_the_attempts(repo, start_env, ports_from):
    server = TritonServer(repo)
    errors = [WideError(f"attempt {i}") for i in range(3)]
    calls = _starts(server, [("already in use", e) for e in errors])
    with pytest.raises(WideError) as err:
        server.start()
    assert err.value is errors[2]
    assert [c[2:] for c in calls] == [(40001, 40002), (40003, 40004), (40005, 40006)]
    assert (server.http_port, server.grpc_port) == (40005, 40006)  # no fresh ports after the last attempt
    assert ports_from == ["127.0.0.1"] * 6


def test_start_with_fewer_attempts(repo, start_env, ports_from):
    server = TritonServer(repo, address="127.0.0.2")
    errors = [WideError(f"attempt {i}") for i in range(2)]
    calls = _starts(server, [("already in use", e) for e in errors])
    with pytest.raises(WideError) as err:
        server.start(attempts=2)
    assert err.value is errors[1] and len(calls) == 2
    assert ports_from == ["127.0.0.2"] * 4
    server = TritonServer(repo)
    one = _starts(server, [("already in use", WideError("only"))])
    with pytest.raises(WideError, match="^only$"):
        server.start(attempts=1)
    assert len(one) == 1


def test_start_with_no_attempts_is_a_bug(repo, start_env):
    server = make_server(repo)
    calls = _starts(server, [])
    with pytest.raises(AssertionError, match="unreachable"):
        server.start(attempts=0)
    assert calls == []


def test_start_does_not_retry_another_failure(repo, start_env, ports_from):
    server = TritonServer(repo)
    boom = WideError("tritonserver was not ready after 3 s")
    calls = _starts(server, [("E model failed to load", boom), None])
    with pytest.raises(WideError) as err:
        server.start()
    assert err.value is boom and len(calls) == 1
    assert (server.http_port, server.grpc_port) == (40001, 40002)


def test_start_does_not_retry_other_errors(repo, start_env, ports_from):
    server = TritonServer(repo)
    calls = _starts(server, [("already in use", RuntimeError("a bug")), None])
    with pytest.raises(RuntimeError, match="a bug"):
        server.start()
    assert len(calls) == 1


def test_a_port_asked_for_and_lost_is_named(repo, start_env):
    server = make_server(repo, http_port=8000, grpc_port=8001)
    calls = _starts(server, [("E ... already in use", WideError("exited")), None])
    with pytest.raises(WideError) as err:
        server.start()
    assert "already in use" in err.value.message and "(HTTP 8000, gRPC 8001)" in err.value.message
    assert "ports" in err.value.hint
    assert err.value.__cause__ is None and err.value.__suppress_context__ is True
    asked = {"--http-port": 8000, "--grpc-port": 8001, "--metrics-port": None}
    assert start_env.checks == [("127.0.0.1", asked), ("127.0.0.1", asked)]
    assert len(calls) == 1


def test_a_lost_port_asked_for_names_its_holder_when_it_can(repo, start_env, ports_from):
    server = make_server(repo, http_port=8000, grpc_port=None)
    holder = WideError("--http-port 8000 on 127.0.0.1 is already in use by 77 (nginx)")
    start_env.check_raises = [None, holder]
    _starts(server, [("already in use", WideError("exited")), None])
    with pytest.raises(WideError) as err:
        server.start()
    assert err.value is holder
    assert start_env.checks[1] == ("127.0.0.1", {"--http-port": 8000, "--grpc-port": None, "--metrics-port": None})


def test_a_taken_port_is_refused_before_anything_starts(repo, start_env):
    server = make_server(repo)
    start_env.check_raises = [WideError("--http-port 8123 on 127.0.0.1 is already in use")]
    calls = _starts(server, [None])
    with pytest.raises(WideError, match="already in use"):
        server.start()
    assert calls == []


# ---------------------------------------------------------------------------------------- _start_once


@pytest.fixture
def launch(monkeypatch, tmp_path, killpg):
    """Popen, server_environment and python_stubs faked; temp folders under tmp_path/tmp."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(server_mod.tempfile, "tempdir", str(tmp))
    rec = SimpleNamespace(popen=[], envs=[], stub_pids=[], proc=FakeProc(), tmp=tmp, killpg=killpg,
                          stubs={7: Stub(7, "wide_llm", "wide_llm_0_0", "triton_python_backend_shm_region_7")})

    def popen(cmd, **kw):
        rec.popen.append((cmd, kw))
        kw["stdout"].write(b"I server starting\n")
        return rec.proc

    def environment(binary):
        rec.envs.append(binary)
        return {"FAKE_ENV": "1"}

    def stubs(pid):
        rec.stub_pids.append(pid)
        return dict(rec.stubs)

    monkeypatch.setattr(server_mod.subprocess, "Popen", popen)
    monkeypatch.setattr(server_mod, "server_environment", environment)
    monkeypatch.setattr(server_mod, "python_stubs", stubs)
    return rec


def _ready_after(server, waits):
    def wait_ready(timeout):
        waits.append(timeout)

    server.wait_ready = wait_ready


def test_start_once_launches_the_server_with_its_log(repo, launch):
    server = make_server(repo)
    server._served_repository = Path("/stale")
    server._shm_regions = {"triton_python_backend_shm_region_old"}
    waits = []
    _ready_after(server, waits)
    assert server._start_once(BIN, 33.0) is server
    work = Path(server._workdir.name)
    assert work.parent == launch.tmp and work.name.startswith("wide-triton-")
    assert server._served_repository is None
    assert server.log_path == work / "tritonserver.log"
    assert server.log_path.read_bytes() == b"I server starting\n"  # the child's stdout is the log
    [(cmd, kw)] = launch.popen
    assert cmd == ["/opt/triton/bin/tritonserver", f"--model-repository={repo.resolve()}",
                   "--http-address=127.0.0.1", "--http-port=8123", "--grpc-address=127.0.0.1", "--grpc-port=8124",
                   "--disable-auto-complete-config", "--exit-timeout-secs=5", "--log-verbose=0",
                   "--model-control-mode=none",
                   "--http-restricted-api=shared-memory,logging,trace,statistics:wide-refused=\n",
                   "--grpc-restricted-protocol=shared-memory,logging,trace,statistics:wide-refused=\n",
                   "--allow-metrics=false"]
    assert sorted(kw) == ["env", "preexec_fn", "start_new_session", "stderr", "stdin", "stdout"]
    assert callable(kw["preexec_fn"])  # umask 077 and the parent-death signal (test_triton_cli: kill -9)
    assert kw["env"] == {"FAKE_ENV": "1"} and launch.envs == [BIN]
    assert kw["stdout"].name == str(work / "tritonserver.log") and kw["stdout"].mode == "wb"
    assert kw["stdout"].closed  # the parent's copy is closed once the child has it
    assert kw["stderr"] is subprocess.STDOUT and kw["stdin"] is subprocess.DEVNULL
    assert kw["start_new_session"] is True
    assert server.process is launch.proc
    assert waits == [33.0]
    assert launch.stub_pids == [4242]
    assert server._stubs == launch.stubs
    assert server._shm_regions == {"triton_python_backend_shm_region_old", "triton_python_backend_shm_region_7"}
    assert launch.proc.calls == []  # nothing stopped
    assert sorted(p.name for p in work.iterdir()) == ["tritonserver.log"]  # no backends for a system server
    server._workdir.cleanup()


def test_start_once_of_the_bundled_server_uses_a_private_backend_folder(repo, launch, tmp_path):
    (tmp_path / "pb").mkdir()
    (tmp_path / "pb" / "libtriton_python.so").write_text("so")
    (tmp_path / "stub").write_text("stub")
    binary = ServerBinary(tmp_path / "ts", True, python_backend=tmp_path / "pb", stub=tmp_path / "stub")
    server = make_server(repo)
    _ready_after(server, [])
    server._start_once(binary, 1.0)
    work = Path(server._workdir.name)
    [(cmd, _)] = launch.popen
    assert cmd[0] == str(tmp_path / "ts")
    assert cmd[-1] == f"--backend-directory={work / 'backends'}"
    assert (work / "backends" / "python" / "triton_python_backend_stub").read_text() == "stub"
    assert (work / "backends" / "python" / "libtriton_python.so").read_text() == "so"
    server._workdir.cleanup()


def test_a_repository_path_the_stub_cannot_parse_is_served_through_a_link(tmp_path, launch):
    root = tmp_path / "my models (v2)"
    (root / "m").mkdir(parents=True)
    server = make_server(root)
    _ready_after(server, [])
    server._start_once(BIN, 1.0)
    work = Path(server._workdir.name)
    link = work / "repository"
    assert server._served_repository == link
    assert link.is_symlink() and link.readlink() == root.resolve() and link.is_dir()
    [(cmd, _)] = launch.popen
    assert cmd[1] == f"--model-repository={link}"
    server._workdir.cleanup()


def test_a_temp_folder_the_stub_cannot_parse_is_refused(repo, launch, monkeypatch, tmp_path):
    spaced = tmp_path / "temp dir"
    spaced.mkdir()
    monkeypatch.setattr(server_mod.tempfile, "tempdir", str(spaced))
    server = make_server(repo)
    with pytest.raises(WideError) as err:
        server._start_once(BIN, 1.0)
    made = list(spaced.iterdir())
    assert made == [] and server._workdir is None  # refused, and its temp folder is gone
    work = re.search(r"'(.*)'", err.value.message).group(1)  # the temp folder, quoted
    assert Path(work).parent == spaced and Path(work).name.startswith("wide-triton-")
    assert "TMPDIR" in err.value.hint
    assert launch.popen == []


def test_a_server_that_cannot_be_launched_leaves_no_temp_folder(repo, launch, monkeypatch):
    """Popen failing (a binary that is not executable): the error as it is, no temp folder, and no
    signal to the pid of a process from before (`process` is None)."""
    server = make_server(repo)
    server.process = FakeProc(pid=999, returncode=0)  # the previous attempt's, stopped already

    def refuse(cmd, **kw):
        raise PermissionError(13, "Permission denied", cmd[0])

    monkeypatch.setattr(server_mod.subprocess, "Popen", refuse)
    with pytest.raises(PermissionError):
        server._start_once(BIN, 1.0)
    assert list(launch.tmp.iterdir()) == [] and server._workdir is None
    assert server.process is None and launch.killpg.calls == []


@pytest.mark.parametrize("path,ok", [
    ("/tmp/wide-triton-abc_12", True), ("/a/b+c@d%e:f,g=h.i-j", True), ("/tmp/x y", False),
    ("/tmp/x'y", False), ("/tmp/é", False), ("/tmp/x\ny", False), ("", False), ("/tmp/$HOME", False)])
def test_check_workdir(path, ok):
    if ok:
        TritonServer._check_workdir(path)
    else:
        with pytest.raises(WideError, match="cannot pass to its stub"):
            TritonServer._check_workdir(path)


@pytest.mark.parametrize("error", [WideError("not ready"), KeyboardInterrupt()])
def test_a_start_that_fails_stops_the_server_and_keeps_its_log(repo, launch, error):
    server = make_server(repo)

    def wait_ready(timeout):
        raise error

    server.wait_ready = wait_ready
    with pytest.raises(type(error)) as err:
        server._start_once(BIN, 5.0)
    assert err.value is error
    assert launch.proc.calls == [("poll",), ("send_signal", SIGTERM), ("wait", 20.0)]
    assert launch.killpg.calls == [(4242, SIGKILL)]
    assert server._workdir is None and list(launch.tmp.iterdir()) == []
    assert server.log_path is None and server._final_log == "I server starting\n"
    assert server.log_text() == "I server starting\n"
    assert launch.stub_pids == []


# ------------------------------------------------------------------------------------ stubs / restart


def test_current_stubs(tmp_path, monkeypatch):
    seen = []
    found = {11: Stub(11, "a", "a_0_0", "region_a"), 12: Stub(12, "b", "b_0_0", "region_b")}
    monkeypatch.setattr(server_mod, "python_stubs", lambda pid: seen.append(pid) or dict(found))
    server = make_server(tmp_path)
    assert server._current_stubs() == {}
    assert seen == []
    server.process = FakeProc(pid=77)
    server._shm_regions = {"region_old"}
    assert server._current_stubs() == found
    assert seen == [77]
    assert server._shm_regions == {"region_old", "region_a", "region_b"}


def test_restart_kills_then_starts_on_the_same_ports(tmp_path, monkeypatch):
    server = make_server(tmp_path)
    events = []
    binary = ServerBinary(Path("/x"), False)
    monkeypatch.setattr(server_mod, "find_tritonserver", lambda: events.append("find") or binary)
    server.stop = lambda **kw: events.append(("stop", kw))
    server._start_once = lambda b, t: events.append(("start", b, t, server.http_port, server.grpc_port))
    server.restart()
    server.restart(timeout=4.5)
    assert events == [("stop", {"timeout": 0, "keep_address": True}), "find", ("start", binary, 120.0, 8123, 8124),
                      ("stop", {"timeout": 0, "keep_address": True}), "find", ("start", binary, 4.5, 8123, 8124)]


# ------------------------------------------------------------------------------------- python_models


def test_python_models_are_the_python_backend_ones(tmp_path):
    root = tmp_path / "r"
    configs = {
        "wide_llm": 'name: "wide_llm"\nbackend: "python"\nmax_batch_size: 8\n',
        "spaced": '  backend :  "python"\n',
        "tabbed": 'name: "t"\n\tbackend:"python"',
        "onnx": 'backend: "onnxruntime"\n',
        "commented": '# backend: "python"\nbackend: "onnxruntime"\n',
        "inline": 'name: "x" backend: "python"\n',
        "pythonic": 'backend: "python3"\n',
        "binary": 'backend: "python"\n# \xff\xfe\n',
    }
    for name, text in configs.items():
        (root / name).mkdir(parents=True)
        (root / name / "config.pbtxt").write_bytes(text.encode("latin-1"))
    (root / "deep" / "x").mkdir(parents=True)
    (root / "deep" / "x" / "config.pbtxt").write_text('backend: "python"\n')
    server = make_server(root)
    models = server.python_models()
    assert models == {"wide_llm", "spaced", "tabbed", "binary"}
    (root / "onnx" / "config.pbtxt").write_text('backend: "python"\n')
    assert server.python_models() is models  # read once
    assert models == {"wide_llm", "spaced", "tabbed", "binary"}


def test_python_models_of_a_repository_without_any(tmp_path):
    server = make_server(tmp_path)
    assert server.python_models() == set()
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.pbtxt").write_text('backend: "python"')
    assert server.python_models() == set()  # cached, even when empty


# -------------------------------------------------------------------------------------- watch_models


def test_watch_models_runs_one_supervision_check(tmp_path, monkeypatch):
    import wide_export.tritonserver.supervise as supervise

    made, answers = [], ["the stub of wide_llm died", "", None]

    class FakeSupervisor:
        def __init__(self, server):
            made.append(server)
            self.report = None
            self.reports = []

        def check(self):
            self.reports.append(self.report)
            return answers.pop(0)

    monkeypatch.setattr(supervise, "Supervisor", FakeSupervisor)
    server = make_server(tmp_path)
    mine = []
    assert server.watch_models(mine.append) == ["the stub of wide_llm died"]
    assert server.watch_models() == []
    assert server.watch_models(mine.append) == []
    assert made == [server]  # one supervisor, kept
    assert server._supervisor.reports == [mine.append, print, mine.append]


# ------------------------------------------------------------------------------------------ is_ready


class _Health(http.server.BaseHTTPRequestHandler):
    status = 200
    paths: list = []

    def do_GET(self):  # noqa: N802 - http.server's name
        type(self).paths.append(self.path)
        self.send_response(type(self).status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def health():
    """A loopback HTTP server (port 0, a thread of this process) answering every GET with .status."""
    handler = type("Health", (_Health,), {"status": 200, "paths": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    yield SimpleNamespace(port=server.server_address[1], handler=handler)
    server.shutdown()
    server.server_close()
    thread.join(5)


def test_is_ready_asks_the_http_health_endpoint(tmp_path, health, monkeypatch):
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")  # no proxy is asked: it would not answer
    monkeypatch.setenv("no_proxy", "")
    # the product asks with a 1 s timeout (it asks again while a start waits); this test's one question to a
    # thread of a loaded machine gets a generous one, which costs nothing when the answer is on time
    monkeypatch.setattr(server_mod, "READY_TIMEOUT_S", 30.0)
    server = make_server(tmp_path, http_port=health.port)
    assert server.is_ready() is True
    health.handler.status = 503
    assert server.is_ready() is False
    health.handler.status = 204  # a success, but not the 200 of a ready server
    assert server.is_ready() is False
    assert health.handler.paths == ["/v2/health/ready"] * 3


def test_is_ready_is_false_when_nobody_answers(tmp_path):
    import socket

    with socket.socket() as sock:  # bound, not listening: connection refused
        sock.bind(("127.0.0.1", 0))
        server = make_server(tmp_path, http_port=sock.getsockname()[1])
        assert server.is_ready() is False


class FakeOpener:
    def __init__(self, status=200, raises=None):
        self.status, self.raises, self.opened = status, raises, []

    def open(self, url, timeout=None):
        self.opened.append((url, timeout))
        if self.raises is not None:
            raise self.raises
        opener = self

        class Response:
            status = opener.status

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

        return Response()


def test_is_ready_probe_url_and_timeout(tmp_path, monkeypatch):
    opener = FakeOpener()
    monkeypatch.setattr(server_mod, "_DIRECT", opener)
    server = make_server(tmp_path, address="127.0.0.5", http_port=8123)
    assert server.is_ready() is True
    assert opener.opened == [("http://127.0.0.5:8123/v2/health/ready", 1.0)]


@pytest.mark.parametrize("raised", [urllib.error.URLError("refused"), ConnectionResetError(104, "reset"),
                                    TimeoutError("timed out")])
def test_is_ready_is_false_on_connection_errors(tmp_path, monkeypatch, raised):
    monkeypatch.setattr(server_mod, "_DIRECT", FakeOpener(raises=raised))
    assert make_server(tmp_path).is_ready() is False


@pytest.fixture
def fake_grpc(monkeypatch):
    """tritonclient.grpc replaced: InferenceServerClient(url) records its use; .ready is the answer."""
    rec = SimpleNamespace(urls=[], asks=[], closed=0, ready=True, raises=None, init_raises=None)

    class Client:
        def __init__(self, url):
            if rec.init_raises is not None:
                raise rec.init_raises
            rec.urls.append(url)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            rec.closed += 1
            return False

        def is_server_ready(self, **kw):
            rec.asks.append(kw)
            if rec.raises is not None:
                raise rec.raises
            return rec.ready

    grpc = types.ModuleType("tritonclient.grpc")
    grpc.InferenceServerClient = Client
    top = types.ModuleType("tritonclient")
    top.grpc = grpc
    monkeypatch.setitem(sys.modules, "tritonclient", top)
    monkeypatch.setitem(sys.modules, "tritonclient.grpc", grpc)
    return rec


def test_is_ready_without_http_asks_over_grpc(tmp_path, monkeypatch, fake_grpc):
    monkeypatch.setattr(server_mod, "_DIRECT", FakeOpener(raises=AssertionError("HTTP probed")))
    server = make_server(tmp_path, http=False, address="127.0.0.4")
    assert server.is_ready() is True
    assert fake_grpc.urls == ["127.0.0.4:8124"] and fake_grpc.asks == [{"client_timeout": 1.0}]
    assert fake_grpc.closed == 1
    fake_grpc.ready = 1
    assert server.is_ready() is True
    fake_grpc.ready = 0
    assert server.is_ready() is False
    fake_grpc.ready = None
    assert server.is_ready() is False
    fake_grpc.raises = RuntimeError("unavailable")
    assert server.is_ready() is False
    fake_grpc.init_raises = ValueError("bad url")
    assert server.is_ready() is False


# ----------------------------------------------------------------------------------- _answers_are_ours


def test_answers_are_ours_asks_who_holds_the_probed_port(tmp_path, monkeypatch):
    asked, owned = [], [False]
    monkeypatch.setattr(ports, "owns_port", lambda pids, port: asked.append((list(pids), port)) or owned[0])
    server = make_server(tmp_path)
    assert server._answers_are_ours() is True  # nothing started here: nothing to tell
    assert asked == []
    server.process = FakeProc(pid=91)
    assert server._answers_are_ours() is False
    owned[0] = True
    assert server._answers_are_ours() is True
    server.http = False
    assert server._answers_are_ours() is True
    assert asked == [([91], 8123), ([91], 8123), ([91], 8124)]


# ---------------------------------------------------------------------------------------- wait_ready


@pytest.fixture
def clock(monkeypatch):
    fake = Clock()
    monkeypatch.setattr(server_mod, "time", fake)
    return fake


def _probes(server, ready, ours=None):
    """is_ready / _answers_are_ours answer from the lists (the last answer repeats); calls recorded."""
    log = []

    def answer(name, answers):
        def probe():
            log.append(name)
            return answers[min(sum(1 for n in log if n == name) - 1, len(answers) - 1)]
        return probe

    server.is_ready = answer("ready", ready)
    server._answers_are_ours = answer("ours", ours if ours is not None else [True])
    return log


def test_wait_ready_returns_at_the_first_ready_answer_of_ours(tmp_path, clock):
    server = make_server(tmp_path)
    log = _probes(server, [False, False, True])
    server.wait_ready(10.0)
    assert log == ["ready", "ready", "ready", "ours"]
    assert clock.sleeps == [0.1, 0.1]


def test_wait_ready_polls_the_process_each_round(tmp_path, clock):
    server = make_server(tmp_path)
    server.process = FakeProc()
    _probes(server, [False, True])
    server.wait_ready(10.0)
    assert server.process.calls == [("poll",), ("poll",)]


def test_wait_ready_does_not_take_another_servers_answer(tmp_path, clock):
    server = make_server(tmp_path)
    server.process = FakeProc()
    log = _probes(server, [True], ours=[False])
    with pytest.raises(WideError, match="not ready after 1 s"):
        server.wait_ready(1.0)
    assert log == ["ready", "ours"] * 4  # at t = 0, 0.25, 0.5, 0.75 of 1 s
    assert clock.sleeps == [0.1] * 4


def test_wait_ready_times_out_with_the_log(tmp_path, clock):
    server = make_server(tmp_path)
    server._final_log = "I loading\nE1 model wide_llm failed\nI still loading"
    log = _probes(server, [False], ours=[True])
    with pytest.raises(WideError) as err:
        server.wait_ready(2.6)
    assert "not ready after 2.6 s" in err.value.message
    assert err.value.message.endswith(":\nI loading\nE1 model wide_llm failed\nI still loading")  # the log, whole
    assert "server log" in err.value.hint
    assert log == ["ready"] * 11  # t = 0 .. 2.5 in steps of 0.25
    assert clock.now == 1002.75


def test_wait_ready_with_no_time_left_probes_nothing(tmp_path, clock):
    server = make_server(tmp_path)
    log = _probes(server, [True])
    with pytest.raises(WideError, match="not ready after 0 s"):
        server.wait_ready(0.0)
    assert log == [] and clock.sleeps == []


def test_wait_ready_reports_a_server_that_exited(tmp_path, clock):
    server = make_server(tmp_path)
    server.process = FakeProc(returncode=0)  # even a clean exit is not "ready"
    server._final_log = "E0 failed to bind: address already in use"
    log = _probes(server, [True])
    with pytest.raises(WideError) as err:
        server.wait_ready(10.0)
    assert "exited with code 0 " in err.value.message
    assert err.value.message.endswith(":\nE0 failed to bind: address already in use")  # the log
    assert "server log" in err.value.hint
    assert log == []
    server.process = FakeProc(returncode=-9)
    with pytest.raises(WideError, match="exited with code -9 "):
        server.wait_ready(10.0)


def test_wait_ready_notices_an_exit_while_waiting(tmp_path, clock):
    server = make_server(tmp_path)
    proc = server.process = FakeProc()
    log = _probes(server, [False])
    clock.sleep = lambda s: (clock.sleeps.append(s), setattr(proc, "returncode", 3))
    with pytest.raises(WideError, match="exited with code 3"):
        server.wait_ready(10.0)
    assert log == ["ready"] and clock.sleeps == [0.1]


# ------------------------------------------------------------------------------------ log_tail / text


def test_log_tail_keeps_earlier_errors_and_the_last_lines(tmp_path):
    server = make_server(tmp_path)
    early = [f"E{i} error {i}" for i in range(12)]
    tail = [f"I{i} tail" for i in range(7)] + ["E late", "I7 tail", "I8 tail", "E in the tail", "I last"]
    lines = (["I0 starting"] + early[:6] + ["E CudaDriverHelper has not been initialized",
                                            "W0 warning", " E indented", "e lowercase"]
             + early[6:] + ["E x: CUDA driver version is insufficient for CUDA runtime version"]
             + tail)
    server._final_log = "\n".join(lines) + "\n"
    assert server.log_tail() == "\n".join(early[2:] + tail)  # the last 10 errors before the last 12 lines
    assert server.log_tail(3) == "\n".join(early[3:] + ["E late", "I8 tail", "E in the tail", "I last"])


def test_log_tail_of_a_short_log(tmp_path):
    server = make_server(tmp_path)
    assert server.log_tail() == ""
    server._final_log = "E1 one\nI two"
    assert server.log_tail() == "E1 one\nI two"
    assert server.log_tail(1) == "E1 one\nI two"
    server._final_log = "I zero\nE1 one\nI two\nE2 three"
    assert server.log_tail(0) == "E1 one\nE2 three"  # no last lines: only the errors (text[-0:] is all of it)


def test_log_text_reads_the_live_log_else_the_kept_one(tmp_path):
    server = make_server(tmp_path)
    server._final_log = "kept"
    assert server.log_text() == "kept"
    server.log_path = tmp_path / "missing.log"
    assert server.log_text() == "kept"
    server.log_path = tmp_path / "live.log"
    server.log_path.write_bytes(b"I live \xff\n")
    assert server.log_text() == "I live \ufffd\n"


# ---------------------------------------------------------------------------------------------- stop


@pytest.fixture
def shm(tmp_path, monkeypatch):
    folder = tmp_path / "shm"
    folder.mkdir()
    monkeypatch.setattr(server_mod, "SHM_DIR", folder)
    return folder


def test_stop_without_a_process_does_nothing(tmp_path, killpg, shm):
    server = make_server(tmp_path)
    server._shm_regions = {"r"}
    (shm / "r").write_text("")
    assert server.stop() is None
    assert killpg.calls == [] and (shm / "r").exists() and server._shm_regions == {"r"}


def test_stop_terminates_waits_reaps_and_cleans_up(tmp_path, killpg, shm):
    server = make_server(tmp_path)
    server.process = proc = FakeProc(pid=4242, code=0)
    for name in ("triton_python_backend_shm_region_1", "triton_python_backend_shm_region_3", "someone_elses"):
        (shm / name).write_text("")
    server._shm_regions = {"triton_python_backend_shm_region_1", "triton_python_backend_shm_region_2",
                           "triton_python_backend_shm_region_3"}
    assert server.stop() == 0
    assert proc.calls == [("poll",), ("send_signal", SIGTERM), ("wait", 20.0)]
    assert killpg.calls == [(4242, SIGKILL)]  # the stubs in its session
    assert sorted(p.name for p in shm.iterdir()) == ["someone_elses"]
    assert server._shm_regions == set()


def test_a_second_stop_does_not_signal_the_dead_servers_group_again(tmp_path, killpg, shm):
    """serve stops a server whose start failed, then the CLI stops it again: the dead server's pid (and
    process group id) may belong to someone else by then."""
    server = make_server(tmp_path)
    server.process = FakeProc(pid=4242, code=0)
    assert server.stop() == 0 and server.stop() == 0
    assert killpg.calls == [(4242, SIGKILL)]
    server.process = FakeProc(pid=4343, code=0)  # a restart's new server is reaped in its turn
    assert server.stop() == 0
    assert killpg.calls == [(4242, SIGKILL), (4343, SIGKILL)]


def test_stop_a_region_that_cannot_be_removed_does_not_stop_the_cleanup(tmp_path, killpg, shm):
    server = make_server(tmp_path)
    server.process = FakeProc()
    (shm / "region_a").mkdir()  # unlink fails (a folder)
    (shm / "region_a" / "x").write_text("")
    (shm / "region_b").write_text("")
    server._shm_regions = {"region_b", "region_a"}
    server.stop()
    assert sorted(p.name for p in shm.iterdir()) == ["region_a"]
    assert server._shm_regions == set()


@pytest.mark.parametrize("timeout,sig,waited", [
    (20.0, SIGTERM, 20.0), (7.5, SIGTERM, 7.5), (2, SIGTERM, 5), (1, SIGTERM, 5), (0.5, SIGTERM, 5),
    (0, SIGKILL, 5), (-1, SIGKILL, 5)])
def test_stop_signal_and_wait_follow_the_timeout(tmp_path, killpg, shm, timeout, sig, waited):
    server = make_server(tmp_path)
    server.process = proc = FakeProc(code=-15)
    assert server.stop(timeout=timeout) == -15
    assert proc.calls == [("poll",), ("send_signal", sig), ("wait", waited)]


def test_stop_kills_a_server_that_does_not_exit(tmp_path, killpg, shm):
    server = make_server(tmp_path)
    server.process = proc = FakeProc(pid=99, code=-9, hang=1)
    assert server.stop(timeout=8) == -9
    assert proc.calls == [("poll",), ("send_signal", SIGTERM), ("wait", 8), ("wait", 5)]
    assert killpg.calls == [(99, SIGKILL), (99, SIGKILL)]


def test_stop_of_a_server_that_already_exited(tmp_path, killpg, shm):
    server = make_server(tmp_path)
    server.process = proc = FakeProc(pid=55, returncode=3)
    server._shm_regions = {"r1"}
    (shm / "r1").write_text("")
    assert server.stop() == 3
    assert proc.calls == [("poll",)]
    assert killpg.calls == [(55, SIGKILL)]
    assert list(shm.iterdir()) == []


@pytest.mark.parametrize("raised", [ProcessLookupError(3, "no such process"), PermissionError(1, "not permitted")])
def test_stop_when_the_session_is_gone(tmp_path, killpg, shm, raised):
    server = make_server(tmp_path)
    server.process = FakeProc(returncode=0)
    server._shm_regions = {"r1"}
    (shm / "r1").write_text("")
    killpg.raises = raised
    assert server.stop() == 0
    assert list(shm.iterdir()) == []  # cleaned up all the same


def test_stop_removes_the_temp_folder_and_keeps_the_log(tmp_path, killpg, shm):
    server = make_server(tmp_path)
    workdir = tempfile.TemporaryDirectory(dir=tmp_path)
    server._workdir = workdir
    server.log_path = Path(workdir.name) / "tritonserver.log"
    server.log_path.write_bytes(b"I one\nE two \xff\n")
    assert server.stop() is None  # no process
    assert not Path(workdir.name).exists()
    assert server._workdir is None and server.log_path is None
    assert server._final_log == "I one\nE two \ufffd\n"
    assert server.log_text() == "I one\nE two \ufffd\n"
    assert server.stop() is None  # again: nothing left to do


def test_stop_without_a_log_keeps_the_old_one(tmp_path, killpg, shm):
    server = make_server(tmp_path)
    workdir = tempfile.TemporaryDirectory(dir=tmp_path)
    server._workdir = workdir
    server._final_log = "earlier"
    server.log_path = Path(workdir.name) / "tritonserver.log"  # never written
    server.stop()
    assert server._final_log == "earlier" and server._workdir is None
    assert server.log_path == Path(workdir.name) / "tritonserver.log"


def test_keep_log_without_a_log_path(tmp_path):
    server = make_server(tmp_path)
    server._final_log = "x"
    server._keep_log()
    assert server._final_log == "x" and server.log_path is None


# ------------------------------------------------------------------------------------ serve_until_signal


@pytest.fixture
def loop(monkeypatch, tmp_path):
    """A server whose watch_models / stop are recorded; Event.wait(poll) records poll and never blocks."""
    waits, events = [], []

    class Event(threading.Event):
        def wait(self, timeout=None):
            waits.append(timeout)
            return super().wait(0)

    import wide_export.base.signals as signals_mod  # where serve_until_signal's wait lives

    fake = SimpleNamespace(**{k: getattr(threading, k) for k in dir(threading) if not k.startswith("__")})
    fake.Event = Event
    monkeypatch.setattr(signals_mod, "threading", fake)
    server = make_server(tmp_path)
    server.stop = lambda *a, **kw: events.append(("stop", a, kw))
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    rec = SimpleNamespace(server=server, waits=waits, events=events, before=before, handlers=[])

    def watch(after=3, sig=signal.SIGTERM, raises=None):
        def watch_models(report):
            events.append(("watch", report))
            rec.handlers.append({s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)})
            if raises is not None:
                raise raises
            if sum(e[0] == "watch" for e in events) == after:
                handler = signal.getsignal(sig)  # never call the one from before (pytest's, or mutmut's: exits)
                assert handler not in before.values(), f"no handler of serve_until_signal for {sig!r}"
                handler(sig, None)  # as if the signal arrived now
        server.watch_models = watch_models

    rec.watch = watch
    yield rec
    assert {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)} == before  # handlers put back


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serve_until_signal_supervises_each_poll_until_a_signal(loop, sig):
    loop.watch(after=3, sig=sig)
    report = []
    loop.server.serve_until_signal(poll=0.25, report=report.append, check=lambda: loop.events.append("check"),
                                   before_stop=lambda: loop.events.append("before_stop"))
    w = ("watch", report.append)
    assert loop.events == [w, "check", w, "check", w, "check", "before_stop", ("stop", (), {})]
    assert loop.waits == [0.25] * 4
    for during in loop.handlers:  # ours while serving, for both signals
        for sig_ in (signal.SIGINT, signal.SIGTERM):
            assert during[sig_] not in loop.before.values() and callable(during[sig_])


def test_serve_until_signal_defaults(loop):
    loop.watch(after=1)
    loop.server.serve_until_signal()
    assert loop.events == [("watch", print), ("stop", (), {})]
    assert loop.waits == [0.5, 0.5]


def test_a_signal_before_the_first_poll_stops_at_once(loop):
    loop.watch(after=1)
    loop.server.watch_models = lambda report: pytest.fail("supervised after the signal")
    import wide_export.base.signals as signals_mod

    real_wait = signals_mod.threading.Event.wait

    def wait(self, timeout=None):  # the signal arrives during the first wait
        signal.getsignal(signal.SIGINT)(signal.SIGINT, None)
        return real_wait(self, timeout)

    signals_mod.threading.Event.wait = wait
    loop.server.serve_until_signal(poll=1.0)
    assert loop.events == [("stop", (), {})] and loop.waits == [1.0]


def test_a_failing_check_stops_the_server_and_raises(loop):
    loop.watch(after=99)
    calls = []

    def check():
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("the frontend died")

    with pytest.raises(RuntimeError, match="the frontend died"):
        loop.server.serve_until_signal(poll=0.1, check=check, before_stop=lambda: loop.events.append("before_stop"))
    assert [e if isinstance(e, str) else e[0] for e in loop.events] == ["watch", "watch", "before_stop", "stop"]


def test_a_server_that_cannot_come_back_stops_with_its_error(loop):
    loop.watch(raises=WideError("tritonserver keeps failing"))
    with pytest.raises(WideError, match="keeps failing"):
        loop.server.serve_until_signal(poll=0.1, check=lambda: loop.events.append("check"))
    assert [e[0] for e in loop.events] == ["watch", "stop"]


def test_the_supervisors_own_failure_is_reported_once_and_retried_not_fatal(loop):
    """EMFILE while reading /proc (a connection flood) killed `serve` and tritonserver with it."""
    import errno

    calls = []

    def watch_models(report):
        calls.append(1)
        if len(calls) <= 3:
            raise OSError(errno.EMFILE, "Too many open files", "/proc")
        if len(calls) == 4:
            return
        if len(calls) == 5:
            raise KeyError("a stub's field")
        signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)

    loop.server.watch_models = watch_models
    report = []
    assert loop.server.serve_until_signal(poll=0.1, report=report.append) == signal.SIGTERM
    assert len(calls) == 6 and loop.events == [("stop", (), {})]
    assert report == ["supervision check failed (OSError: [Errno 24] Too many open files: '/proc'); retrying",
                      "supervision check failed (KeyError: \"a stub's field\"); retrying"]


def test_a_failing_before_stop_still_stops_the_server(loop):
    loop.watch(after=1)

    def before_stop():
        raise OSError("frontend would not stop")

    with pytest.raises(OSError, match="would not stop"):
        loop.server.serve_until_signal(poll=0.1, before_stop=before_stop)
    assert [e[0] for e in loop.events] == ["watch", "stop"]


def test_a_failing_stop_still_puts_the_handlers_back(loop):
    loop.watch(after=1)

    def stop():
        raise RuntimeError("stop failed")

    loop.server.stop = stop
    with pytest.raises(RuntimeError, match="stop failed"):
        loop.server.serve_until_signal(poll=0.1)


# ------------------------------------------------------------------------------------- context manager


def test_with_starts_a_server_once(tmp_path, killpg):
    server = make_server(tmp_path)
    started, stopped = [], []
    result = object()
    server.start = lambda *a, **kw: started.append((a, kw)) or result
    server.stop = lambda *a, **kw: stopped.append((a, kw))
    assert server.__enter__() is result  # never started
    server.process = FakeProc(returncode=1)
    assert server.__enter__() is result  # exited: started again
    server.process = FakeProc()
    with server as inside:  # running: `with TritonServer(...).start()` does not start a second one
        assert inside is server
    assert started == [((), {}), ((), {})]
    assert stopped == [((), {})]


def test_a_failed_start_of_a_private_grpc_server_leaves_no_socket_folder(repo, launch, monkeypatch):
    """A start that fails (here: never ready) removes the private socket's folder, and looking at the
    stopped server's address afterwards creates none again."""
    monkeypatch.setattr(server_mod, "find_tritonserver", lambda: BIN)
    monkeypatch.setattr("wide_export.tritonserver.ports.check_ports_free", lambda *a, **k: None)
    short = Path(tempfile.mkdtemp(prefix="w", dir="/tmp"))  # pytest's own folders can be too long for a socket
    monkeypatch.setattr(server_mod.tempfile, "tempdir", str(short))
    server = TritonServer(repo, http=False, private_grpc=True)

    def never_ready(timeout):
        raise WideError("tritonserver did not become ready")

    server.wait_ready = never_ready
    try:
        with pytest.raises(WideError, match="did not become ready"):
            server.start(timeout=1.0, attempts=1)
        sock = server.endpoints.grpc
        assert Path(sock[5:]).parent.parent == short, sock
        assert not list(short.glob("wide-grpc-*")), sock
    finally:
        shutil.rmtree(short, ignore_errors=True)


def _tensorrt_repository(root: Path) -> Path:
    (root / "wide_llm" / "1").mkdir(parents=True)
    (root / "wide_llm" / "config.pbtxt").write_text('name: "wide_llm"\nbackend: "python"\n')
    (root / "wide_llm_engine" / "1").mkdir(parents=True)
    (root / "wide_llm_engine" / "config.pbtxt").write_text('name: "wide_llm_engine"\nplatform: "tensorrt_plan"\n')
    return root


def test_serving_a_tensorrt_repository_without_a_gpu_is_one_line(tmp_path, monkeypatch):
    """Was tritonserver's load log ending in 'pip install torch' (torch was installed)."""
    import torch
    from typer.testing import CliRunner

    from tests.helpers import assert_one_line_error
    from wide_export.cli import app

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(server_mod.subprocess, "Popen", lambda *a, **k: pytest.fail("tritonserver was started"))
    repo = _tensorrt_repository(tmp_path / "repo")
    line = assert_one_line_error(CliRunner().invoke(app, ["serve", "--repository", str(repo)]))
    assert "TensorRT" in line and "wide_llm_engine" in line and "CUDA GPU" in line
    assert "wide-export triton --onnx" in line and "pip install torch" not in line


def test_a_tensorrt_repository_on_the_bundled_server_says_it_lacks_the_backend(tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    repo = _tensorrt_repository(tmp_path / "repo")
    with pytest.raises(WideError, match="nvidia-pytriton .*TensorRT") as err:
        server_mod.check_tensorrt_models(repo, ServerBinary(path=Path("/x/tritonserver"), bundled=True))
    assert "on PATH" in err.value.hint
    server_mod.check_tensorrt_models(repo, ServerBinary(path=Path("/usr/bin/tritonserver"), bundled=False))
    (repo / "wide_llm_engine" / "config.pbtxt").write_text('name: "wide_llm_engine"\nbackend: "onnxruntime"\n')
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    server_mod.check_tensorrt_models(repo, ServerBinary(path=Path("/x/tritonserver"), bundled=True))  # no TensorRT
