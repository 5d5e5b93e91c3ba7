"""`wide-vllm serve`'s API key (vllm/compat.serve_api_key, vllm/auth.GuardAll), without starting vLLM: vLLM's
--api-key, VLLM_API_KEY or WIDE_API_KEY turn on a guard of every route but /health (vLLM's own guards only
/v1-like prefixes: /invocations, /metrics, /tokenize stay open); no key beyond loopback is a warning note."""

from __future__ import annotations

import json

import pytest

from wide_export.vllm.compat import GiB, serve_defaults

GUARD = ["--middleware", "wide_export.vllm.auth.GuardAll"]


def _serve(*extra, environ=None):
    environ = {} if environ is None else environ
    args, notes = serve_defaults(["serve", "OUT", *extra], cpu=False, total=32 * GiB, available=30 * GiB, weights=0,
                                 environ=environ)
    return args, notes, environ


def _warnings(notes):
    return [n for n in notes if "warning" in n]


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.7"])
def test_no_key_beyond_loopback_is_a_warning(host):
    args, notes, environ = _serve("--host", host)
    assert GUARD[0] not in args and environ == {}
    [line] = _warnings(notes)
    assert line.startswith("wide-vllm: warning: ") and host in line
    assert "--api-key" in line and "VLLM_API_KEY" in line and "WIDE_API_KEY" in line


@pytest.mark.parametrize("extra", [(), ("--host", "127.0.0.1"), ("--host", "localhost")])
def test_no_warning_on_loopback(extra):
    args, notes, _ = _serve(*extra)
    assert _warnings(notes) == [] and GUARD[0] not in args


@pytest.mark.parametrize("extra,environ,keys", [
    (("--api-key", "k1", "k2", "--port", "8000"), {}, ["k1", "k2"]),
    (("--api-key=k1",), {"WIDE_API_KEY": "w"}, ["k1"]),  # the flag first, as in vLLM
    ((), {"VLLM_API_KEY": "v", "WIDE_API_KEY": "w"}, ["v"]),
    ((), {"WIDE_API_KEY": "w"}, ["w"]),
])
def test_a_key_guards_every_route_and_silences_the_warning(extra, environ, keys):
    args, notes, environ = _serve("--host", "0.0.0.0", *extra, environ=dict(environ))
    assert args[-2:] == GUARD and args.count(GUARD[0]) == 1
    assert json.loads(environ["WIDE_VLLM_API_KEYS"]) == keys
    assert _warnings(notes) == [] and any("API key on" in n for n in notes)
    if keys == ["w"]:
        assert environ["VLLM_API_KEY"] == "w"  # vLLM's own guard of /v1 has it too


def test_an_empty_wide_api_key_is_none():
    args, notes, environ = _serve("--host", "0.0.0.0", environ={"WIDE_API_KEY": " "})
    assert GUARD[0] not in args and "VLLM_API_KEY" not in environ and _warnings(notes)


def test_the_guard_asks_for_a_key_on_every_route_but_health(monkeypatch):
    pytest.importorskip("fastapi")
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from wide_export.vllm.auth import GuardAll

    app = FastAPI()
    for path in ("/health", "/invocations", "/metrics", "/tokenize", "/v1/models"):
        app.add_api_route(path, lambda: {"ok": True}, methods=["GET", "POST"])
    monkeypatch.setenv("WIDE_VLLM_API_KEYS", json.dumps(["k1", "k2"]))
    app.add_middleware(GuardAll)  # as vLLM's --middleware does
    with TestClient(app) as client:
        for path in ("/invocations", "/metrics", "/tokenize", "/v1/models"):
            for headers in ({}, {"Authorization": "Bearer k3"}, {"Authorization": "Bearer k1k2"}):
                resp = client.post(path, headers=headers)
                assert resp.status_code == 401 and resp.json()["error"]["code"] == "invalid_api_key", path
            for key in ("k1", "k2"):
                assert client.post(path, headers={"Authorization": f"Bearer {key}"}).status_code == 200
        assert client.get("/health").status_code == 200
        assert client.options("/v1/models").status_code != 401  # a CORS preflight carries no key (as vLLM)
    monkeypatch.delenv("WIDE_VLLM_API_KEYS")
    with pytest.raises(ValueError, match="WIDE_VLLM_API_KEYS"):
        GuardAll(app)
