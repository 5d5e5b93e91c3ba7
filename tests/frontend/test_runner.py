"""serving/openai/runner.py without tritonserver: the port reservation and its refusals, the URL, the lifecycle
of the uvicorn thread (start, check, stop twice, no restart), and prepare_frontend's order of checks."""

from __future__ import annotations

import os
import socket
import time

import pytest

from tests.frontend.fakes import MODEL, FakeEngine, served
from wide_export.base.errors import WideError
from wide_export.serving.openai import runner
from wide_export.serving.openai.runner import Frontend, bind_socket, prepare_frontend


@pytest.mark.parametrize("port", [-1, 65536, 70000])
def test_a_port_outside_tcp_is_refused(port):
    with pytest.raises(WideError, match=f"^--openai-port {port} ") as err:
        bind_socket("127.0.0.1", port)
    assert "1..65535" in err.value.hint


def test_the_socket_is_bound_reusable_and_not_inherited():
    sock = bind_socket("127.0.0.1", 0)
    try:
        host, port = sock.getsockname()
        assert host == "127.0.0.1" and 0 < port < 65536
        assert sock.family == socket.AF_INET and sock.type == socket.SOCK_STREAM
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR) == 1
        assert sock.get_inheritable() is False
    finally:
        sock.close()


def test_an_ipv6_host_gets_an_ipv6_socket_and_a_bracketed_url():
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    try:
        sock = bind_socket("::1", 0)
    except WideError as err:
        pytest.skip(f"::1 cannot be bound here: {err}")
    try:
        assert sock.family == socket.AF_INET6
        frontend = Frontend([served()], sock, engine=FakeEngine())
        assert frontend.url == f"http://[::1]:{frontend.port}/v1"
    finally:
        sock.close()


def test_the_url_of_an_ipv4_frontend():
    sock = bind_socket("127.0.0.1", 0)
    try:
        frontend = Frontend([served()], sock, engine=FakeEngine())
        assert frontend.host == "127.0.0.1"
        assert frontend.url == f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    finally:
        sock.close()


def _bind_a_taken_port() -> tuple[int, pytest.ExceptionInfo]:
    """bind_socket on a port this process listens on: (the port, the WideError it raised)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(WideError) as err:
            bind_socket("127.0.0.1", port)
    return port, err


def test_a_taken_port_names_who_holds_it():
    port, err = _bind_a_taken_port()
    message = err.value.message
    assert f"127.0.0.1:{port} " in message and "already in use" in message
    assert f"{os.getpid()} (" in message  # this test process holds it
    assert "--openai-port" in err.value.hint


def test_a_taken_port_whose_holder_cannot_be_seen(monkeypatch):
    import wide_export.tritonserver.ports as ports

    monkeypatch.setattr(ports, "holders", lambda port: [])
    port, err = _bind_a_taken_port()
    assert f"127.0.0.1:{port} " in err.value.message and err.value.message.endswith("already in use")  # no "by"


def test_an_address_that_is_not_ours_is_another_error():
    import errno

    with pytest.raises(WideError) as err:
        bind_socket("192.0.2.1", 0)  # TEST-NET-1: not an address of this machine
    assert "192.0.2.1:0" in err.value.message and err.value.message.endswith(f": {os.strerror(errno.EADDRNOTAVAIL)}")
    assert "--openai-address" in err.value.hint


def test_lifecycle_start_check_stop_twice_no_restart():
    engine = FakeEngine()
    frontend = Frontend([served()], bind_socket("127.0.0.1", 0), engine=engine)
    assert not frontend.alive() and frontend.app is None
    frontend.check()  # not started: nothing to report
    frontend.start(timeout=30)
    try:
        assert frontend.alive() and engine.started
        frontend.check()  # serving: fine
        assert frontend.app is not None and frontend.engine is engine
        with socket.create_connection(("127.0.0.1", frontend.port), timeout=5):
            pass  # it accepts connections
    finally:
        frontend.stop()
    assert not frontend.alive() and engine.closed
    frontend.check()  # stopped on purpose: not an unexpected stop
    frontend.stop()  # idempotent
    with pytest.raises(WideError) as err:
        frontend.start()
    assert "stopped" in err.value.message


def test_a_frontend_thread_that_died_is_reported():
    frontend = Frontend([served()], bind_socket("127.0.0.1", 0), engine=FakeEngine())
    frontend.start(timeout=30)
    try:
        frontend._error = RuntimeError("boom")
        frontend._server.force_exit = True  # uvicorn ends without being asked to (should_exit unset)
        frontend._server.should_exit = True
        frontend._thread.join(10)
        frontend._server.should_exit = False
        with pytest.raises(WideError) as err:
            frontend.check()
        assert "stopped unexpectedly" in err.value.message and err.value.message.endswith(": boom")
        frontend._error = None
        with pytest.raises(WideError) as err:
            frontend.check()
        assert err.value.message.endswith("stopped unexpectedly")  # no reason to add
    finally:
        frontend.stop()


def test_prepare_frontend_checks_models_before_the_port(tmp_path, monkeypatch):
    """No generation model: refused before a port is taken (the port stays free)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(WideError, match="holds no generation model"):
        prepare_frontend(tmp_path, port=port)
    bind_socket("127.0.0.1", port).close()


def test_prepare_frontend_releases_the_port_when_a_tokenizer_fails(tmp_path, monkeypatch):
    from tests.frontend.test_repository import write_model
    from wide_export.serving.openai import models

    write_model(tmp_path, MODEL)

    def broken(self):
        raise WideError("cannot load the tokenizer")

    monkeypatch.setattr(models.ServedModel, "load_text", broken)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(WideError, match="cannot load the tokenizer"):
        prepare_frontend(tmp_path, port=port)
    bind_socket("127.0.0.1", port).close()  # released


def test_prepare_frontend_gives_a_frontend_on_the_port(tmp_path):
    from tests.frontend.test_repository import write_model

    write_model(tmp_path, MODEL)
    frontend = prepare_frontend(tmp_path, port=0, served_model_name="served")
    try:
        assert [(m.name, m.triton_name) for m in frontend.models] == [("served", MODEL)]
        assert frontend.models[0].text is not None and frontend.engine is None
        assert frontend.host == runner.LOOPBACK == "127.0.0.1" and frontend.port > 0
    finally:
        frontend.stop()


def test_missing_libraries_are_named(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("uvicorn", "tritonclient") else real(name, *a))
    with pytest.raises(WideError, match="uvicorn, tritonclient") as err:
        runner.check_installed()
    assert err.value.hint.startswith("python3 -m venv .venv-serve") and "[triton]" in err.value.hint
    monkeypatch.setattr(importlib.util, "find_spec", real)
    runner.check_installed()


def test_the_triton_engine_serves_the_repository_names_of_the_served_models():
    """The lifecycle starts the frontend with a TritonEngine for the served models (served name -> the model's
    name in the repository); the frontend itself knows only the Engine protocol."""
    from wide_export.serving.triton_engine import TritonEngine

    models = [served("a"), served("b")]
    models[1].triton_name = "b_triton"
    frontend = Frontend(models, bind_socket("127.0.0.1", 0), engine=FakeEngine())
    try:
        assert frontend.served_names() == {"a": "a", "b": "b_triton"}
        engine = TritonEngine("127.0.0.1:8001", frontend.served_names())
        assert engine.where == "tritonserver at 127.0.0.1:8001"
        frontend.start(timeout=30)
        assert frontend.engine.started
    finally:
        frontend.stop()


def test_without_an_engine_start_is_refused():
    frontend = Frontend([served()], bind_socket("127.0.0.1", 0))
    with pytest.raises(ValueError, match="an engine is required"):
        frontend.start(timeout=30)
    frontend.stop()


def test_the_server_thread_is_a_named_daemon():
    frontend = Frontend([served()], bind_socket("127.0.0.1", 0), engine=FakeEngine()).start(timeout=30)
    try:
        assert frontend._thread.daemon is True and frontend._thread.name == "openai-frontend"
    finally:
        frontend.stop()


def test_no_access_log_and_no_info_lines(caplog):
    import logging
    import urllib.request

    with caplog.at_level(logging.DEBUG):
        frontend = Frontend([served()], bind_socket("127.0.0.1", 0), engine=FakeEngine()).start(timeout=30)
        try:
            with urllib.request.urlopen(f"{frontend.url}/models", timeout=10) as resp:
                assert resp.status == 200
        finally:
            frontend.stop()
    uvicorn_lines = [r for r in caplog.records if r.name.startswith("uvicorn")]
    assert not [r for r in uvicorn_lines if r.name == "uvicorn.access"]
    assert not [r for r in uvicorn_lines if r.levelno < logging.WARNING], [r.getMessage() for r in uvicorn_lines]


def test_a_start_that_does_not_finish_in_time_is_refused(monkeypatch):
    # A server that never reports started (deterministic: a real uvicorn could start before the first look
    # at an already-passed deadline, which made this test pass or fail by the thread's timing). It runs
    # until stop() asks it to exit.
    def never_starts(self):
        while not self._server.should_exit:
            time.sleep(0.01)

    monkeypatch.setattr(Frontend, "_run", never_starts)
    frontend = Frontend([served()], bind_socket("127.0.0.1", 0), engine=FakeEngine())
    with pytest.raises(WideError) as err:
        frontend.start(timeout=0.3)
    assert err.value.message.endswith("did not start")  # timed out: no reason to add
    assert not frontend.alive()


def test_a_server_that_dies_at_start_says_why():
    sock = bind_socket("127.0.0.1", 0)
    frontend = Frontend([served()], sock, engine=FakeEngine())
    sock.close()  # uvicorn cannot listen on it
    with pytest.raises(WideError) as err:
        frontend.start(timeout=30)
    assert err.value.message.startswith("the OpenAI frontend did not start: ")
    assert len(err.value.message) > len("the OpenAI frontend did not start: ")


@pytest.mark.parametrize("failure, said", [
    (RuntimeError("plain failure"), "plain failure"),
    (WideError("its own words", hint="not repeated"), "its own words"),
    (__import__("wide_export.serving.openai.engine", fromlist=["EngineError"]).EngineError("unavailable", "no model"),
     "no model")])
def test_an_engine_that_fails_to_start_is_one_line_with_the_url(failure, said):
    class Failing(FakeEngine):
        async def start(self):
            raise failure

    frontend = Frontend([served()], bind_socket("127.0.0.1", 0), engine=Failing())
    frontend.engine.where = "tritonserver at 127.0.0.1:9"  # as serving/triton_engine.TritonEngine names itself
    with pytest.raises(WideError) as err:
        frontend.start(timeout=30)
    assert "tritonserver at 127.0.0.1:9" in err.value.message and err.value.message.endswith(f": {said}")
    assert "\n" not in err.value.message and "server log" in err.value.hint and "not repeated" not in err.value.hint
    assert not frontend.alive()
