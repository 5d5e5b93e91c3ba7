"""Connection and body limits of the OpenAI frontend, on a real uvicorn server over
a fake engine, spoken to with raw sockets so the client's own behaviour cannot hide the server's."""

from __future__ import annotations

import json
import socket
import time

import pytest

from tests.frontend.fakes import FakeEngine, served
from wide_export.serving.openai.limits import Limits

FAST = dict(header_timeout_s=1.0, body_timeout_s=1.5, keep_alive_s=5.0)


@pytest.fixture
def start():
    from wide_export.serving.openai.runner import Frontend, bind_socket

    started = []

    def run(limits: Limits):
        frontend = Frontend([served()], bind_socket("127.0.0.1", 0), engine=FakeEngine(), limits=limits).start()
        started.append(frontend)
        return ("127.0.0.1", frontend.port)

    yield run
    for frontend in started:
        frontend.stop()


def _read_all(sock: socket.socket, timeout: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes, and when it closed (seconds from now)."""
    sock.settimeout(timeout)
    t0, got = time.monotonic(), b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            got += chunk
    except ConnectionResetError:
        pass
    return got, time.monotonic() - t0


def _status(raw: bytes) -> int:
    return int(raw.split(b" ", 2)[1])


def _body(raw: bytes) -> dict:
    return json.loads(raw.split(b"\r\n\r\n", 1)[1])


def test_a_connection_that_sends_nothing_is_closed_at_the_header_deadline(start):
    address = start(Limits(**FAST))
    with socket.create_connection(address) as sock:
        got, after = _read_all(sock, 12)
    assert got == b"" and 0.8 < after < 8, after


def test_half_a_header_gets_a_408_at_the_header_deadline(start):
    address = start(Limits(**FAST))
    with socket.create_connection(address) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Ty")
        got, after = _read_all(sock, 12)
    assert _status(got) == 408 and 0.8 < after < 8, (got, after)
    assert "request header" in _body(got)["error"]["message"]


def test_a_body_that_never_ends_gets_a_408_at_the_body_deadline(start):
    address = start(Limits(**FAST))
    with socket.create_connection(address) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n4\r\n{\"a\"\r\n")
        got, after = _read_all(sock, 12)
    assert _status(got) == 408 and 1.2 < after < 8, (got, after)
    assert "request body" in _body(got)["error"]["message"]


def test_a_kept_alive_connection_gets_a_new_header_deadline_after_each_answer(start):
    address = start(Limits(header_timeout_s=1.0, body_timeout_s=1.5, keep_alive_s=30.0))
    with socket.create_connection(address) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.settimeout(5)
        assert _status(sock.recv(65536)) == 200
        sock.sendall(b"GET /hea")  # then nothing
        got, after = _read_all(sock, 12)
    assert _status(got) == 408 and after < 8, (got, after)  # not the 30 s keep-alive


def test_connections_over_the_cap_get_a_fast_503_and_the_cap_frees_again(start):
    address = start(Limits(max_connections=4, header_timeout_s=10.0, body_timeout_s=10.0, keep_alive_s=10.0))
    held = [socket.create_connection(address) for _ in range(4)]
    try:
        time.sleep(0.2)
        with socket.create_connection(address) as extra:
            extra.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            got, after = _read_all(extra, 15)
        assert _status(got) == 503 and after < 5, (got, after)  # at once, not at a 10 s deadline
        assert _body(got)["error"]["type"] == "service_unavailable"
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.2)
    with socket.create_connection(address) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert _status(_read_all(sock, 5)[0]) == 200


def _completion(body: bytes, chunked: bool = False) -> bytes:
    if chunked:
        framed = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (body[i:i + 65536]
                                                                        for i in range(0, len(body), 65536)))
        return (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n" + framed + b"0\r\n\r\n")
    return (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body) + body)


@pytest.mark.parametrize("chunked", [False, True])
def test_a_body_over_the_limit_is_a_413_before_it_is_read_whole(start, chunked):
    address = start(Limits(max_body_bytes=100_000, **FAST))
    ok = json.dumps({"model": "wide_llm", "prompt": "hi", "max_tokens": 2, "pad": "x" * 90_000}).encode()
    with socket.create_connection(address) as sock:
        sock.sendall(_completion(ok, chunked))
        got, _ = _read_all(sock, 5)
    assert _status(got) == 200, got[:300]
    big = json.dumps({"model": "wide_llm", "prompt": "hi", "unknown": "x" * 5_000_000}).encode()
    with socket.create_connection(address) as sock:
        try:
            sock.sendall(_completion(big, chunked))
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed before the whole body went out
        got, _ = _read_all(sock, 5)
    assert _status(got) == 413, got[:300]
    error = _body(got)["error"]
    assert error["code"] == "request_too_large" and "100000 bytes" in error["message"]


def test_a_declared_length_over_the_limit_is_refused_before_any_body_byte(start):
    address = start(Limits(max_body_bytes=100_000, header_timeout_s=10.0, body_timeout_s=10.0, keep_alive_s=10.0))
    with socket.create_connection(address) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000000000\r\n\r\n")
        got, after = _read_all(sock, 15)
    assert _status(got) == 413 and after < 5, (got[:200], after)  # at once, not at the 10 s body deadline
    assert "(1000000000 bytes)" in _body(got)["error"]["message"]


def test_a_pipelined_request_behind_an_answered_one_still_has_a_body_deadline(start):
    address = start(Limits(**FAST))
    with socket.create_connection(address) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
                     b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"model\": ")
        got, after = _read_all(sock, 12)
    assert got.count(b"HTTP/1.1 ") == 2 and b" 408 " in got and after < 8, (got[-300:], after)
