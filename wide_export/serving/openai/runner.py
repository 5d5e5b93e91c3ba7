"""Run the OpenAI frontend on uvicorn in a background thread of `wide-export serve` (or a benchmark).

`prepare_frontend` does everything that can fail before tritonserver starts: it
finds the repository's generation models, reserves the port (a port in use is one
WideError line with a hint) and loads the tokenizers. `Frontend.start(engine)`
then starts the engine (serving/triton_engine.py on the running tritonserver, or the CPU one) and serves; `stop()` shuts uvicorn down
(open streams get a few seconds, then they are cancelled, which cancels their
Triton requests) before the caller stops tritonserver.
"""

from __future__ import annotations

import errno
import socket
import threading
import time
from pathlib import Path
from typing import Optional, Sequence

from wide_export.base.errors import WideError
from wide_export.serving.openai.limits import Limits
from wide_export.serving.openai.models import ServedModel, discover

LOOPBACK = "127.0.0.1"
GRACEFUL_S = 3  # seconds open connections get at shutdown before their tasks are cancelled
DRAIN_S = 0.2  # seconds between telling open streams that the server stops and closing their connections


def check_installed(names: tuple[str, ...] = ("fastapi", "uvicorn", "tritonclient")) -> None:
    """WideError naming what to install when the frontend's libraries are missing (tritonclient: only in front
    of tritonserver)."""
    from importlib.util import find_spec

    missing = [name for name in names if find_spec(name) is None]
    if missing:
        from wide_export.tritonserver.server import SERVING_ENV

        raise WideError(f"the OpenAI API needs {', '.join(missing)}, which is not installed", hint=SERVING_ENV)


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening-ready TCP socket on host:port (port 0: any free one); WideError when it cannot bind."""
    if not 0 <= port < 65536:
        raise WideError(f"--openai-port {port} is not a TCP port", hint="use 1..65535")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: reuse after TIME_WAIT
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        if err.errno == errno.EADDRINUSE:
            from wide_export.tritonserver.ports import holders

            who = holders(port)
            by = f" by {', '.join(who)}" if who else ""
            raise WideError(f"the OpenAI port {host}:{port} is already in use{by}",
                            hint="choose another --openai-port, or stop what listens there") from None
        raise WideError(f"cannot listen on {host}:{port} for the OpenAI frontend: {err.strerror or err}",
                        hint="check --openai-address") from None
    sock.set_inheritable(False)
    return sock


class Frontend:
    """The OpenAI frontend of one repository, served by uvicorn in a daemon thread."""

    def __init__(self, models: Sequence[ServedModel], sock: socket.socket, engine=None,
                 limits: Optional[Limits] = None, policy=None, api_key: Optional[str] = None):
        self.models = list(models)
        self.api_key = api_key  # with one, every route but /health needs it (auth.ApiKey)
        self.limits = limits or Limits.for_this_process()
        self.policy = policy  # admission.RequestPolicy (None: its defaults)
        self._sock: Optional[socket.socket] = sock
        self.host, self.port = sock.getsockname()[:2]
        self.engine = engine  # or the one start() is given
        self._server = None
        self._thread: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None
        self.app = None

    @property
    def url(self) -> str:
        """Base URL of the API (what OpenAI clients take as base_url)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    def served_names(self) -> dict[str, str]:
        """Each served name's model in the repository (what serving/triton_engine.TritonEngine maps)."""
        return {m.name: m.triton_name for m in self.models}

    def start(self, engine=None, timeout: float = 60.0) -> "Frontend":
        """Start `engine` (an openai.engine.Engine, default: the one given when made) and serve; returns once
        serving."""
        import uvicorn

        from wide_export.serving.openai.app import create_app
        from wide_export.serving.openai.limits import BodyLimit, guarded_protocol

        if self._sock is None:
            raise WideError("this frontend was stopped; prepare a new one")
        self.engine = engine or self.engine
        if self.engine is None:
            raise ValueError("an engine is required")
        self.app = create_app(self.engine, self.models, self.policy)
        limits = self.limits
        asgi = BodyLimit(self.app, limits.max_body_bytes)
        if self.api_key:
            from wide_export.base.api_key import ApiKey

            asgi = ApiKey(asgi, self.api_key)  # before the body is read: a stranger's body costs nothing
        config = uvicorn.Config(asgi, log_config=None, log_level="warning",
                                access_log=False, loop="asyncio", lifespan="on", http=guarded_protocol(limits),
                                timeout_graceful_shutdown=GRACEFUL_S, timeout_keep_alive=limits.keep_alive_s)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._run, name="openai-frontend", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                why = f": {self._error}" if self._error is not None else ""
                raise WideError(f"the OpenAI frontend did not start{why}")
            time.sleep(0.02)
        failure = getattr(self.app.state, "startup_error", None)
        if failure is not None:
            self.stop()
            where = getattr(self.engine, "where", "its engine")
            raise WideError(f"the OpenAI frontend cannot use {where}: "
                            f"{getattr(failure, 'message', None) or failure}",
                            hint="is the model loaded? read the server log")
        return self

    def _run(self) -> None:
        try:
            self._server.run(sockets=[self._sock])
        except BaseException as err:  # noqa: BLE001 - uvicorn exits with SystemExit on startup failure
            self._error = err

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def check(self) -> None:
        """WideError when the frontend thread ended while it should serve."""
        if self._thread is not None and not self._thread.is_alive() and self._server is not None \
                and not self._server.should_exit:
            raise WideError(f"the OpenAI frontend stopped unexpectedly{f': {self._error}' if self._error else ''}")

    def stop(self, timeout: float = GRACEFUL_S + 7.0) -> None:
        """Shut down (idempotent): open connections get GRACEFUL_S seconds, then are cancelled."""
        if self._server is not None:
            if self.app is not None and not self._server.should_exit:
                from wide_export.serving.openai.app import begin_shutdown

                begin_shutdown(self.app)  # open streams end with an error event and [DONE] ...
                time.sleep(DRAIN_S)  # ... sent before uvicorn closes their connections
            self._server.should_exit = True
            if self._thread is not None:
                self._thread.join(timeout)
                if self._thread.is_alive():
                    self._server.force_exit = True
                    self._thread.join(5)
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def prepare_frontend(repository: Path, host: str = LOOPBACK, port: int = 0,
                     served_model_name: Optional[str] = None, limits: Optional[Limits] = None,
                     policy=None, api_key: Optional[str] = None) -> Frontend:
    """Models found, port reserved, tokenizers loaded: ready to start once tritonserver is."""
    check_installed()
    models = discover(repository, served_model_name)
    sock = bind_socket(host, port)
    try:
        for model in models:
            model.load_text()
    except BaseException:
        sock.close()
        raise
    return Frontend(models, sock, limits=limits, policy=policy, api_key=api_key)

