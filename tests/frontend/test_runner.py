"""frontend/runner.py without tritonserver: the port reservation and its refusals, the URL, the lifecycle
of the uvicorn thread (start, check, stop twice, no restart), and prepare_frontend's order of checks."""

from __future__ import annotations

import os
import socket
import time

import pytest

from tests.frontend.fakes import MODEL, FakeEngine, served
from wide_export.errors import WideError
from wide_export.frontend import runner
from wide_export.frontend.runner import Frontend, bind_socket, prepare_frontend


@pytest.mark.parametrize("port", [-1, 65536, 70000])
def test_a_port_outside_tcp_is_refused(port):
    with pytest.raises(WideError, match=f"--openai-port {port} is not a TCP port") as err:
        bind_socket("127.0.0.1", port)
    assert err.value.hint == "use 1..65535"


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
    assert message.startswith(f"the OpenAI port 127.0.0.1:{port} is already in use by ")
    assert f"{os.getpid()} (" in message  # this test process holds it
    assert err.value.hint == "choose another --openai-port, or stop what listens there"


def test_a_taken_port_whose_holder_cannot_be_seen(monkeypatch):
    import wide_export.triton.ports as ports

    monkeypatch.setattr(ports, "holders", lambda port: [])
    port, err = _bind_a_taken_port()
    assert err.value.message == f"the OpenAI port 127.0.0.1:{port} is already in use"


def test_an_address_that_is_not_ours_is_another_error():
    import errno

    with pytest.raises(WideError) as err:
        bind_socket("192.0.2.1", 0)  # TEST-NET-1: not an address of this machine
    assert err.value.message == f"cannot listen on 192.0.2.1:0 for the OpenAI frontend: " \
                                f"{os.strerror(errno.EADDRNOTAVAIL)}"
    assert err.value.hint == "check --openai-address"


def test_start_without_an_engine_needs_the_grpc_url():
    sock = bind_socket("127.0.0.1", 0)
    try:
        with pytest.raises(ValueError) as err:
            Frontend([served()], sock).start()
        assert str(err.value) == "grpc_url is required without an engine"
    finally:
        sock.close()


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
    assert err.value.message == "this frontend was stopped; prepare a new one"


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
        assert err.value.message == "the OpenAI frontend stopped unexpectedly: boom"
        frontend._error = None
        with pytest.raises(WideError) as err:
            frontend.check()
        assert err.value.message == "the OpenAI frontend stopped unexpectedly"
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
    from wide_export.frontend import models

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
    with pytest.raises(WideError, match="the OpenAI API needs uvicorn, tritonclient, which is not installed") as err:
        runner.check_installed()
    assert err.value.hint.startswith("python3 -m venv .venv-serve") and "[triton]" in err.value.hint
    monkeypatch.setattr(importlib.util, "find_spec", real)
    runner.check_installed()


def test_without_an_engine_a_triton_engine_is_made_for_the_grpc_url(monkeypatch):
    import wide_export.frontend.engine as engine_module

    made = []

    class Recording(FakeEngine):
        def __init__(self, url, models):
            super().__init__()
            made.append((url, models))

    monkeypatch.setattr(engine_module, "TritonEngine", Recording)
    models = [served("a"), served("b")]
    models[1].triton_name = "b_triton"
    frontend = Frontend(models, bind_socket("127.0.0.1", 0))
    try:
        frontend.start("127.0.0.1:8001", timeout=30)
        assert made == [("127.0.0.1:8001", {"a": "a", "b": "b_triton"})]
        assert isinstance(frontend.engine, Recording) and frontend.engine.started
    finally:
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
    assert err.value.message == "the OpenAI frontend did not start"
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
    (__import__("wide_export.frontend.engine", fromlist=["EngineError"]).EngineError("unavailable", "no model"),
     "no model")])
def test_an_engine_that_fails_to_start_is_one_line_with_the_url(failure, said):
    class Failing(FakeEngine):
        async def start(self):
            raise failure

    frontend = Frontend([served()], bind_socket("127.0.0.1", 0), engine=Failing())
    with pytest.raises(WideError) as err:
        frontend.start("127.0.0.1:9", timeout=30)
    assert err.value.message == f"the OpenAI frontend cannot use tritonserver at 127.0.0.1:9: {said}"
    assert err.value.hint == "is the model loaded? read the server log"
    assert not frontend.alive()
