"""The OpenAI API's key (serving/openai/auth.py; `serve --api-key`, WIDE_API_KEY): every route but /health needs
`Authorization: Bearer KEY`, else a 401 in OpenAI's error shape; and the warning line when an API listens
beyond loopback without a key."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from types import SimpleNamespace

import pytest

from tests.frontend.fakes import PIECES, FakeEngine, served
from tests.helpers import assert_one_line_error

pytest.importorskip("fastapi")

KEY = "s3cret-key"


@pytest.fixture
def guarded():
    from fastapi.testclient import TestClient

    from wide_export.serving.openai.app import create_app
    from wide_export.base.api_key import ApiKey

    engine = FakeEngine()
    with TestClient(ApiKey(create_app(engine, [served()]), KEY)) as client:
        client.engine = engine
        yield client


def _refused(resp) -> None:
    assert resp.status_code == 401, (resp.status_code, resp.text)
    error = resp.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_api_key"
    assert "Bearer" in error["message"] and KEY not in resp.text
    assert resp.headers["www-authenticate"] == "Bearer"


BODY = {"prompt": "hi", "max_tokens": 2}


@pytest.mark.parametrize("headers", [
    {},
    {"Authorization": "Bearer wrong"},
    {"Authorization": f"Bearer {KEY}x"},
    {"Authorization": f"Bearer {KEY[:-1]}"},
    {"Authorization": f"Basic {KEY}"},  # the right key in another scheme
    {"Authorization": KEY},
    {"Authorization": "Bearer "},
])
def test_every_route_but_health_needs_the_key(guarded, headers):
    _refused(guarded.post("/v1/completions", json=BODY, headers=headers))
    _refused(guarded.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]},
                          headers=headers))
    _refused(guarded.get("/v1/models", headers=headers))
    _refused(guarded.get("/metrics", headers=headers))  # any route, known or not
    assert guarded.engine.requests == []  # nothing reached the model
    assert guarded.get("/health", headers=headers).status_code == 200  # a load balancer's probe stays open


def test_the_right_key_is_served(guarded):
    auth = {"Authorization": f"Bearer {KEY}"}
    resp = guarded.post("/v1/completions", json=BODY, headers=auth)
    assert resp.status_code == 200 and resp.json()["choices"][0]["text"] == "".join(PIECES)
    assert guarded.get("/v1/models", headers={"authorization": f"bearer {KEY}"}).status_code == 200
    assert guarded.get("/metrics", headers=auth).status_code == 404  # past the key: the app's own answer
    assert len(guarded.engine.requests) == 1


def test_a_key_beyond_ascii_is_compared_as_the_utf8_a_client_sends():
    from wide_export.base.api_key import ApiKey

    guard = ApiKey(None, ["clé-🔑", "other"])
    assert guard.allowed([(b"authorization", "Bearer clé-🔑".encode())])
    assert guard.allowed([(b"Authorization", b"bearer other")])
    assert not guard.allowed([(b"authorization", "Bearer clé-🔑".encode("utf-8")[:-1])])
    assert not guard.allowed([(b"authorization", "Bearer clé".encode("latin-1"))])
    assert not guard.allowed([(b"x-api-key", b"other")])


def test_the_key_comes_from_the_flag_else_the_environment():
    from wide_export.base.errors import WideError
    from wide_export.base.api_key import ENV, api_key_from

    assert ENV == "WIDE_API_KEY"
    assert api_key_from("flag", {ENV: "env"}) == "flag"
    assert api_key_from(None, {ENV: "env"}) == "env"
    assert api_key_from(None, {ENV: ""}) is None and api_key_from(None, {}) is None
    with pytest.raises(WideError, match="--api-key must not be empty"):
        api_key_from(" ", {ENV: "env"})


@pytest.mark.parametrize("host,key,warned", [
    ("0.0.0.0", None, True),
    ("::", None, True),
    ("192.0.2.7", None, True),
    ("0.0.0.0", KEY, False),
    ("127.0.0.1", None, False),
    ("127.0.0.2", None, False),
    ("::1", None, False),
    ("localhost", None, False),
])
def test_a_warning_line_when_listening_beyond_loopback_without_a_key(capsys, host, key, warned):
    from wide_export.cli.triton_cmd import _warn_exposed

    _warn_exposed(SimpleNamespace(host=host, api_key=key), None)
    out, err = capsys.readouterr()
    assert out == ""
    if warned:
        assert len(err.splitlines()) == 1 and err.startswith("warning: ")
        assert host in err and "--api-key" in err and "WIDE_API_KEY" in err
    else:
        assert err == ""


def test_tritonservers_own_endpoints_beyond_loopback_are_warned_about(capsys):
    from wide_export.cli.triton_cmd import _warn_exposed

    _warn_exposed(SimpleNamespace(host="127.0.0.1", api_key=None), "0.0.0.0")
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "tritonserver" in err and "0.0.0.0" in err
    _warn_exposed(None, "127.0.0.1")
    assert capsys.readouterr().err == ""


def _serve(*args):
    return subprocess.run([sys.executable, "-m", "wide_export", "serve", *args], capture_output=True, text=True,
                          timeout=120, env={k: v for k, v in os.environ.items() if k != "WIDE_API_KEY"})


def test_api_key_needs_the_openai_api_and_a_value(tmp_path):
    from tests.frontend.test_repository import write_model

    write_model(tmp_path, "wide_llm")
    line = assert_one_line_error(_serve("--repository", str(tmp_path), "--api-key", KEY))
    assert "--api-key is for the OpenAI API" in line and "--openai-port" in line and KEY not in line
    line = assert_one_line_error(_serve("--repository", str(tmp_path), "--openai-port", "0", "--api-key", ""))
    assert "--api-key must not be empty" in line


def _status(url: str, key=None) -> int:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code


@pytest.mark.parametrize("key", [KEY, None])
def test_serve_model_on_every_interface_takes_the_key_from_the_environment_or_warns(tmp_path, monkeypatch, key):
    """The command (in-process, the checkpoint's loading replaced by a fake engine on a real uvicorn server) on
    0.0.0.0: with WIDE_API_KEY set, the key guards the API and no warning; without, one warning line on stderr
    and an open API."""
    from typer.testing import CliRunner

    import wide_export.serving.cpu_server as cpu_serve
    from tests.cpu.test_generation import SPECS
    from tests.helpers import make_checkpoint
    from wide_export.cli import get_app
    from wide_export.serving.openai.runner import Frontend, bind_socket

    ckpt = make_checkpoint(tmp_path / "ck", num_layers=1, **SPECS["llama"])
    seen = {}

    def prepare(model_dir, host, port, name=None, **kw):
        seen["api_key"] = kw.get("api_key")
        return (Frontend([served()], bind_socket(host, port), engine=FakeEngine(), api_key=kw.get("api_key")),
                SimpleNamespace(kernels=None))

    def until_signal(frontend, poll=0.5):
        url = frontend.url.replace("0.0.0.0", "127.0.0.1")
        seen["status"] = (_status(url[:-3] + "/health"), _status(f"{url}/models"), _status(f"{url}/models", "wrong"),
                          _status(f"{url}/models", KEY))
        frontend.stop()
        return signal.SIGTERM

    monkeypatch.setattr(cpu_serve, "prepare", prepare)
    monkeypatch.setattr(cpu_serve, "serve_until_signal", until_signal)
    monkeypatch.delenv("WIDE_API_KEY", raising=False)
    if key:
        monkeypatch.setenv("WIDE_API_KEY", key)
    result = CliRunner().invoke(get_app(), ["serve", "--model", str(ckpt), "--openai-port", "0", "--openai-address",
                                            "0.0.0.0"])
    assert result.exit_code == 143, result.output
    assert seen["api_key"] == key
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    if key:
        assert seen["status"] == (200, 401, 401, 200) and warnings == []
    else:
        assert seen["status"] == (200, 200, 200, 200)
        assert len(warnings) == 1 and "0.0.0.0" in warnings[0] and "--api-key" in warnings[0], result.stderr
