"""`wide-export serve --repository` as a library: a real tritonserver on a model repository, the OpenAI API in
front of it when asked, started together (or not at all) and supervised until a signal. The command only parses
its flags into ServeOptions, shows progress and prints; Python callers get the same lifecycle:

    serving = start_serving(ServeOptions(Path("repo"), openai_port=8000))
    print(serving.endpoints.grpc, serving.frontend.url)
    signum = serving.wait()      # until SIGINT / SIGTERM: restarts a dead or hung server, then stops everything
    # or: serving.stop() when done (also: `with start_serving(...) as serving:`)

(`serve --model`, the CPU path without tritonserver, is wide_export/serving/cpu_server.py.)"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ContextManager, Optional

from wide_export.base.errors import WideError


@dataclass
class ServeOptions:
    """What `wide-export serve --repository` takes. Ports None: Triton's HTTP and gRPC get free ones (with the
    OpenAI API in front and none asked for, Triton's HTTP is off and its gRPC a socket only this user opens);
    metrics off. limits / policy: the OpenAI API's (frontend.limits.Limits, frontend.admission.RequestPolicy;
    None: their defaults), only with openai_port."""

    repository: Path
    http_port: Optional[int] = None
    grpc_port: Optional[int] = None
    metrics_port: Optional[int] = None
    address: str = "127.0.0.1"
    timeout: float = 300.0  # seconds for the models to load
    log_verbose: int = 0
    openai_port: Optional[int] = None
    openai_address: str = "127.0.0.1"
    served_model_name: Optional[str] = None
    limits: Any = None
    policy: Any = None
    api_key: Optional[str] = None  # the OpenAI API's (serving/openai/auth.py); None: open

    def check(self) -> None:
        """WideError for options that cannot work together."""
        if self.openai_port is None and (self.served_model_name is not None or self.limits is not None
                                         or self.policy is not None or self.api_key is not None):
            raise WideError("a served model name, limits, a request policy and an API key are for the OpenAI API",
                            hint="add --openai-port PORT")
        if self.openai_port is not None and self.openai_port in (self.http_port, self.grpc_port, self.metrics_port):
            raise WideError(f"--openai-port {self.openai_port} is also given to another endpoint",
                            hint="give each endpoint its own port")


class Serving:
    """A started tritonserver (`server`, tritonserver/server.py) and the OpenAI frontend in front of it (`frontend`,
    serving/openai/runner.py; None without openai_port)."""

    def __init__(self, server, frontend):
        self.server, self.frontend = server, frontend

    @property
    def endpoints(self):
        return self.server.endpoints

    def wait(self, report: Callable[[str], None] = print) -> int:
        """Serve until SIGINT / SIGTERM (its number is returned, everything stopped), restarting a tritonserver
        that dies or whose model process dies or hangs (at most 5 times in 10 minutes, else WideError); `report`
        gets one line per restart."""
        frontend = self.frontend
        return self.server.serve_until_signal(report=report, check=frontend.check if frontend else None,
                                              before_stop=frontend.stop if frontend else None)

    def stop(self) -> None:
        if self.frontend is not None:
            self.frontend.stop()
        self.server.stop()

    def __enter__(self) -> "Serving":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _no_stage(_message: str) -> ContextManager:
    return contextlib.nullcontext()


def start_serving(opts: ServeOptions, stage: Callable[[str], ContextManager] = _no_stage) -> Serving:
    """tritonserver started on opts.repository and ready, with the OpenAI API in front when opts.openai_port is
    given (its port and the repository's tokenizer checked before tritonserver starts, so a taken port or a bad
    repository fails at once); on any failure nothing is left running. stage(message) wraps each phase (the
    command shows a spinner)."""
    from wide_export.tritonserver.server import TritonServer

    opts.check()
    http = opts.openai_port is None or opts.http_port is not None
    # With the OpenAI API in front and no Triton port asked for, Triton's gRPC is a unix socket only this
    # user can open and its HTTP is off: the OpenAI port is all other local users reach. On every endpoint
    # Triton refuses its shared-memory, logging, trace and statistics APIs (server.RESTRICTED).
    server = TritonServer(opts.repository, http_port=opts.http_port, grpc_port=opts.grpc_port,
                          metrics_port=opts.metrics_port, address=opts.address, log_verbose=opts.log_verbose,
                          http=http, private_grpc=not http and opts.grpc_port is None)
    frontend = None
    try:
        if opts.openai_port is not None:
            from wide_export.serving.openai.runner import prepare_frontend

            with stage("loading the tokenizer for the OpenAI API ..."):
                frontend = prepare_frontend(opts.repository, opts.openai_address, opts.openai_port,
                                            opts.served_model_name, limits=opts.limits, policy=opts.policy,
                                            api_key=opts.api_key)
        with stage("starting tritonserver ..."):
            server.start(timeout=opts.timeout)
        if frontend is not None:
            with stage("starting the OpenAI API ..."):
                from wide_export.serving.triton_engine import TritonEngine

                frontend.start(TritonEngine(server.endpoints.grpc, frontend.served_names()))
    except BaseException:
        if frontend is not None:
            frontend.stop()
        server.stop()
        raise
    return Serving(server, frontend)
