"""Start and stop a real `tritonserver` on loopback, wait until it is ready.

The binary is the system one when `tritonserver` is on PATH, else the one in
the `nvidia-pytriton` wheel (extra `triton`). The wheel's Python-backend stub
is not where the backend looks for it, so for the bundled server we assemble a
private backend directory (copies, in a temp dir) instead of touching
site-packages, as pytriton itself does.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Callable, Optional, Sequence

from wide_export.base import childproc
from wide_export.base.errors import WideError

# The serving packages' own environment (README, "The two commands"): the `triton` extra pins numpy < 2, protobuf and
# ml_dtypes below what the main install takes, so it does not go into the main environment.
SERVING_ENV = ("python3 -m venv .venv-serve && . .venv-serve/bin/activate && pip install -e '.[triton]' (an "
               "environment of its own: the extra downgrades numpy)")

LOOPBACK = "127.0.0.1"
# Errors the server logs on every CPU-only start; not worth showing.
_HARMLESS = ("CudaDriverHelper has not been initialized", "CUDA driver version is insufficient")


# No proxies: readiness polls go straight to the server we started.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))
READY_TIMEOUT_S = 1.0  # one readiness question; is_ready is asked again and again while a start waits

PRIVATE_GRPC_PORT = 1  # the number Triton appends to a private unix-socket address
# Triton APIs no client of ours needs and which hurt when anyone may call them: registering a stub's
# shared-memory region as an output buffer crashes tritonserver; logging and trace settings change what the
# server writes where; statistics tell other users what is being asked. Triton can only guard an API with a
# header key=value given on its command line, which every local user reads in /proc/PID/cmdline, so the
# value is one no request can carry (a line feed: it ends an HTTP/1 header line, and gRPC metadata allows
# printable ASCII only): the APIs are switched off, with no secret anywhere.
RESTRICTED = "shared-memory,logging,trace,statistics"
REFUSED_HEADER = "wide-refused"
_UNSENDABLE = "\n"

STUB_NAME = "triton_python_backend_stub"
SHM_DIR = Path("/dev/shm")
# The python backend launches its stub through `bash -c` with the model path unquoted: a
# path with anything but these characters breaks the stub (`std::invalid_argument: stol`).
_STUB_SAFE_PATH = re.compile(r"[A-Za-z0-9_./+@%:,=-]+")


@dataclass(frozen=True)
class Stub:
    """One python-backend stub process of our server (one per model instance)."""

    pid: int
    model: str  # repository/<model>/<version>/model.py -> <model>
    instance: str  # e.g. wide_llm_0_0
    shm_region: str  # its /dev/shm/triton_python_backend_shm_region_* name


def python_stubs(server_pid: int) -> dict[int, Stub]:
    """The live (not zombie) python-backend stubs whose parent is `server_pid` (Linux /proc)."""
    stubs: dict[int, Stub] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) != server_pid or fields[0] in "ZX":
                continue
            argv = [a.decode(errors="replace") for a in (entry / "cmdline").read_bytes().split(b"\0")]
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        if len(argv) > 8 and Path(argv[0]).name == STUB_NAME:
            stubs[int(entry.name)] = Stub(int(entry.name), Path(argv[1]).parent.parent.name, argv[8], argv[2])
    return stubs


@dataclass(frozen=True)
class ServerBinary:
    """Where a tritonserver lives and what the bundled one needs to run."""

    path: Path
    bundled: bool
    python_backend: Optional[Path] = None  # folder with libtriton_python.so (bundled only)
    stub: Optional[Path] = None  # triton_python_backend_stub for this Python (bundled only)
    libs: Optional[Path] = None  # nvidia_pytriton.libs (bundled only)


def find_tritonserver() -> ServerBinary:
    """The system `tritonserver` if on PATH, else the one bundled in nvidia-pytriton."""
    system = shutil.which("tritonserver")
    if system:
        return ServerBinary(path=Path(system), bundled=False)
    spec = find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise WideError(
            "no tritonserver binary: none on PATH and nvidia-pytriton is not installed",
            hint=f"{SERVING_ENV}, or put tritonserver on PATH",
        )
    root = Path(list(spec.submodule_search_locations)[0]) / "tritonserver"
    binary = root / "bin" / "tritonserver"
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    stub = root / "python_backend_stubs" / version / "triton_python_backend_stub"
    backend = root / "backends" / "python"
    missing = [p for p in (binary, stub, backend / "libtriton_python.so") if not p.exists()]
    if missing:
        raise WideError(
            f"the tritonserver bundled in nvidia-pytriton is incomplete (missing {missing[0]})",
            hint=f"reinstall nvidia-pytriton for Python {version}, or put tritonserver on PATH",
        )
    return ServerBinary(
        path=binary, bundled=True, python_backend=backend, stub=stub,
        libs=root.parent.parent / "nvidia_pytriton.libs",
    )


def _private(region: str) -> None:
    """chmod 0600 a stub's shared-memory region: the Python backend creates it 0644 (an explicit mode the
    umask does not narrow), and it carries every request's tokens. Done when the stub is first seen, before
    the server is reported ready and takes requests; a local user who opened it in the moment between its
    creation and this keeps that descriptor (docs/triton.md)."""
    try:
        os.chmod(SHM_DIR / region, 0o600)
    except OSError:
        pass  # gone already (a stub that died), or not ours to change


def restricted_flags(apis: str, http: bool, grpc: bool) -> list[str]:
    """Triton flags that refuse `apis` (comma-separated, RESTRICTED by default) on the endpoints it serves."""
    if not apis:
        return []
    rule = f"{apis}:{REFUSED_HEADER}={_UNSENDABLE}"
    return ([f"--http-restricted-api={rule}"] if http else []) + ([f"--grpc-restricted-protocol={rule}"] if grpc else [])


def free_port(address: str = LOOPBACK) -> int:
    """A TCP port that is free right now on `address` (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


_TENSORRT_MODEL = re.compile(r'^\s*(platform:\s*"tensorrt_plan"|backend:\s*"tensorrt")', re.M)


def check_tensorrt_models(repository: Path, binary: ServerBinary) -> None:
    """Before tritonserver starts: a repository with TensorRT models needs a CUDA GPU (Triton's TensorRT backend
    runs the engines; the generation model keeps the KV cache on the device) and a tritonserver with the tensorrt
    backend (the one bundled in nvidia-pytriton has only the Python backend). One WideError saying which is
    missing and what serves on this machine instead, rather than the server's load log."""
    names = sorted(p.parent.name for p in Path(repository).glob("*/config.pbtxt")
                   if _TENSORRT_MODEL.search(p.read_text(errors="replace")))
    if not names:
        return
    import torch

    if not torch.cuda.is_available():
        seen = (f"torch {torch.__version__} is a CPU build" if torch.version.cuda is None
                else "torch sees no CUDA device")
        raise WideError(f"{repository} is a TensorRT repository (model {names[0]}): it needs a CUDA GPU for the "
                        f"TensorRT backend and the KV cache on the device, and there is none here ({seen})",
                        hint="on a machine without a GPU serve an ONNX Runtime repository: wide-export triton "
                             "--onnx EXPORT --output REPO, then wide-export serve --repository REPO")
    if binary.bundled:
        raise WideError(f"{repository} is a TensorRT repository (model {names[0]}) and the tritonserver bundled "
                        "in nvidia-pytriton has no TensorRT backend",
                        hint="put NVIDIA's tritonserver (with its tensorrt backend, e.g. from the Triton container) "
                             "on PATH")


def _prepare_backends(binary: ServerBinary, into: Path) -> Path:
    """A private backend folder: python backend + this Python's stub, side by side."""
    assert binary.python_backend is not None and binary.stub is not None
    python_dir = into / "backends" / "python"
    python_dir.mkdir(parents=True)
    for item in binary.python_backend.iterdir():
        if item.is_file():
            shutil.copy2(item, python_dir / item.name)
    shutil.copy2(binary.stub, python_dir / "triton_python_backend_stub")
    return into / "backends"


def server_environment(binary: ServerBinary) -> dict[str, str]:
    """Environment for the server: this Python first on PATH, its libpython loadable."""
    env = dict(os.environ)
    # model.py runs under the first python3 on PATH: make it this environment's.
    # (no or an empty PATH: the system's default search path after it, not an empty entry meaning ".")
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH") or os.defpath])
    lib_dirs: list[str] = []
    libdir = sysconfig.get_config_var("LIBDIR")
    ldlib = sysconfig.get_config_var("LDLIBRARY") or ""
    if libdir and ldlib.endswith(".so") and Path(libdir, ldlib).exists():
        lib_dirs.append(libdir)  # the stub embeds this Python: use its own libpython
    if binary.libs is not None:
        lib_dirs.append(str(binary.libs))  # the copied stub lost its RPATH to these
    if env.get("LD_LIBRARY_PATH"):
        lib_dirs.append(env["LD_LIBRARY_PATH"])
    if lib_dirs:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(lib_dirs)
    return env


@dataclass
class Endpoints:
    """Where the server answers."""

    http: str
    grpc: str
    metrics: Optional[str]


class TritonServer:
    """A tritonserver process serving one model repository on loopback.

    Use as a context manager, or call start() / stop(). start() returns only
    once the server reports ready (all models loaded), else raises WideError
    with the tail of the server log.
    """

    def __init__(
        self,
        repository: Path,
        http_port: Optional[int] = None,
        grpc_port: Optional[int] = None,
        metrics_port: Optional[int] = None,
        address: str = LOOPBACK,
        log_verbose: int = 0,
        exit_timeout: int = 5,
        extra_args: Sequence[str] = (),
        max_reloads: int = 5,
        reload_window: float = 600.0,
        http: bool = True,
        private_grpc: bool = False,
        refuse: str = RESTRICTED,
    ):
        self.repository = Path(repository).resolve()
        for flag, port in (("--http-port", http_port), ("--grpc-port", grpc_port), ("--metrics-port", metrics_port)):
            if port is not None and not 0 < port < 65536:
                raise WideError(f"{flag} {port} is not a TCP port", hint="use 1..65535, or omit it for a free one")
        self.address = address
        self._auto_ports = http_port is None and grpc_port is None
        self._asked_ports = {"--http-port": http_port if http else None, "--grpc-port": grpc_port,
                             "--metrics-port": metrics_port}
        self.http_port = http_port or free_port(address)
        self.grpc_port = grpc_port or free_port(address)
        self.metrics_port = metrics_port
        self.log_verbose = log_verbose
        self.exit_timeout = exit_timeout  # seconds the server waits for open connections on SIGTERM
        self.extra_args = list(extra_args)
        # A dead or hung server or stub restarts tritonserver (supervise.py), at most max_reloads
        # times per reload_window seconds; beyond that serve_until_signal gives up.
        self.max_reloads = max_reloads
        self.reload_window = reload_window
        self.reloads: list[float] = []  # monotonic times of the restarts done
        self.http = http  # False: no HTTP endpoint (`serve --openai-port` without --http-port)
        # private_grpc: gRPC on a unix socket in a 0700 folder of ours instead of a TCP port, so no other
        # local user can reach Triton's API (its shared-memory, logging and trace calls above all); the
        # folder lives from the first start to the final stop, so a restarted server keeps its address.
        if private_grpc and (grpc_port is not None or http):
            raise ValueError("private_grpc is for a server without HTTP and without an asked-for gRPC port")
        self.private_grpc = private_grpc
        self._socket_dir: Optional[str] = None  # the folder, from the first start (or look) to the final stop
        self._socket_path: Optional[str] = None  # kept after the final stop, for reports (nothing is recreated)
        self.refuse = refuse  # Triton APIs refused on every endpoint (RESTRICTED)
        self._supervisor = None
        self._stubs: dict[int, Stub] = {}
        self._shm_regions: set[str] = set()  # our stubs' shared-memory regions, removed at stop()
        self.process: Optional[subprocess.Popen] = None
        self._reaped_group: Optional[int] = None  # the process group stop() already reaped (see stop)
        self._workdir: Optional[tempfile.TemporaryDirectory] = None
        self.log_path: Optional[Path] = None
        self._final_log = ""
        self._served_repository: Optional[Path] = None
        self._python_models: Optional[set[str]] = None

    @property
    def endpoints(self) -> Endpoints:
        """HTTP URL, gRPC host:port and metrics URL (None when disabled)."""
        metrics = f"http://{self.address}:{self.metrics_port}/metrics" if self.metrics_port else None
        grpc = f"unix:{self._grpc_socket()}" if self.private_grpc else f"{self.address}:{self.grpc_port}"
        return Endpoints(http=f"{self.address}:{self.http_port}", grpc=grpc, metrics=metrics)

    def _grpc_socket(self) -> str:
        """The private gRPC socket's path: Triton listens on `unix:<folder>/grpc` + `:<port>`, a file
        named `grpc:1` (it appends the port to the address)."""
        if self._socket_path is None:  # once made, kept: after the final stop it says where it was
            folder = tempfile.mkdtemp(prefix="wide-grpc-")  # 0700, this user's
            path = os.path.join(folder, f"grpc:{PRIVATE_GRPC_PORT}")
            if len(path.encode()) > 100:  # sun_path holds 108 bytes
                shutil.rmtree(folder, ignore_errors=True)
                raise WideError(f"the private gRPC socket's path {path!r} is too long for a unix socket",
                                hint="set TMPDIR to a shorter folder, e.g. /tmp")
            self._socket_dir, self._socket_path = folder, path
        return self._socket_path

    def command(self, binary: ServerBinary, backends: Optional[Path]) -> list[str]:
        """The tritonserver command line (loopback addresses, strict config)."""
        cmd = [
            str(binary.path),
            f"--model-repository={self._served_repository or self.repository}",
            f"--http-address={self.address}", f"--http-port={self.http_port}",
            *self._grpc_flags(),
            "--disable-auto-complete-config",
            f"--exit-timeout-secs={self.exit_timeout}",
            f"--log-verbose={self.log_verbose}",
            # No model control: nobody can load a model (code) into the running server, and no
            # secret has to sit on this command line. A broken model restarts the server (supervise.py).
            "--model-control-mode=none",
        ]
        if not self.http:
            cmd.append("--allow-http=false")
        cmd += restricted_flags(self.refuse, http=self.http, grpc=True)  # on the private socket too: nothing of ours uses them
        if self.metrics_port:
            cmd += ["--allow-metrics=true", f"--metrics-address={self.address}", f"--metrics-port={self.metrics_port}"]
        else:
            cmd += ["--allow-metrics=false"]
        if backends is not None:
            cmd.append(f"--backend-directory={backends}")
        return cmd + self.extra_args

    def _grpc_flags(self) -> list[str]:
        if self.private_grpc:
            return [f"--grpc-address=unix:{self._grpc_socket().rsplit(':', 1)[0]}", f"--grpc-port={PRIVATE_GRPC_PORT}"]
        return [f"--grpc-address={self.address}", f"--grpc-port={self.grpc_port}"]

    def start(self, timeout: float = 120.0, attempts: int = 3) -> "TritonServer":
        """Launch the server and wait until ready (raises WideError on failure or timeout).

        With ports picked here, a port taken by someone else between the pick and the
        bind (other servers starting at the same time) is retried with fresh ports.
        """
        if not self.repository.is_dir():
            raise WideError(f"model repository {self.repository} is not a folder",
                            hint="generate one with `wide-export triton`")
        if not any(self.repository.glob("*/config.pbtxt")):
            raise WideError(f"{self.repository} holds no model (no */config.pbtxt)",
                            hint="generate a repository with `wide-export triton`")
        binary = find_tritonserver()
        check_tensorrt_models(self.repository, binary)
        from wide_export.tritonserver.ports import check_ports_free

        check_ports_free(self.address, self._asked_ports)  # names who holds a taken port, before anything starts
        if self.private_grpc and self._socket_dir is None:
            self._socket_path = None  # a start after a final stop: a fresh private folder
        try:
            return self._start_attempts(binary, timeout, attempts)
        except BaseException:
            self.stop()  # the private socket's folder too: nothing left behind by a start that failed
            raise

    def _start_attempts(self, binary: ServerBinary, timeout: float, attempts: int) -> "TritonServer":
        from wide_export.tritonserver.ports import check_ports_free

        for attempt in range(attempts):
            try:
                return self._start_once(binary, timeout)
            except WideError:
                lost_port = "already in use" in self._final_log
                if lost_port and not self._auto_ports:  # taken between the check above and the server's bind
                    check_ports_free(self.address, self._asked_ports)
                    raise WideError(f"a port asked for is already in use (HTTP {self.http_port}, "
                                    f"gRPC {self.grpc_port})", hint="choose other ports, or omit them") from None
                if not (self._auto_ports and lost_port and attempt + 1 < attempts):
                    raise
                self.http_port, self.grpc_port = free_port(self.address), free_port(self.address)
        raise AssertionError("unreachable")

    def _start_once(self, binary: ServerBinary, timeout: float) -> "TritonServer":
        self._workdir = tempfile.TemporaryDirectory(prefix="wide-triton-")
        self.process = None  # a previous attempt's process was stopped: never signal its (reusable) pid again
        try:  # whatever fails from here (an unsafe TMPDIR, a copy, Popen, readiness): no temp folder left
            work = Path(self._workdir.name)
            self._served_repository = None
            self._check_workdir(str(work))
            if self.private_grpc:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._grpc_socket())  # a killed server's socket file
            backends = _prepare_backends(binary, work) if binary.bundled else None
            if not _STUB_SAFE_PATH.fullmatch(str(self.repository)):
                # Serve it through a link with a plain name: the stub gets paths it can parse.
                self._served_repository = work / "repository"
                self._served_repository.symlink_to(self.repository, target_is_directory=True)
            self.log_path = work / "tritonserver.log"
            with open(self.log_path, "wb") as log:
                # SIGTERM when we die, however (a `kill -9` of `wide-export serve` takes tritonserver down with
                # it, which stops its Python stubs and removes their shared memory); its files 0600 (the stubs'
                # regions need _private: the backend sets their mode)
                self.process = childproc.start(
                    self.command(binary, backends), die_with_parent=True, umask=0o077,
                    env=server_environment(binary), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                )
            self.wait_ready(timeout)
        except BaseException:
            self.stop(keep_address=True)  # a retry or a restart uses the same private socket (the caller's
            raise  # final stop removes it)
        self._stubs = self._current_stubs()
        return self

    @staticmethod
    def _check_workdir(path: str) -> None:
        if not _STUB_SAFE_PATH.fullmatch(path):
            raise WideError(f"the temp folder {path!r} has characters the python backend cannot pass to its stub",
                            hint="set TMPDIR to a folder whose path has no spaces or special characters")

    def _current_stubs(self) -> dict[int, Stub]:
        if self.process is None:
            return {}
        stubs = python_stubs(self.process.pid)
        for region in {s.shm_region for s in stubs.values()} - self._shm_regions:
            _private(region)
        self._shm_regions.update(s.shm_region for s in stubs.values())
        return stubs

    def restart(self, timeout: float = 120.0) -> None:
        """Kill tritonserver and its stubs (they may be hung), start it again on the same ports."""
        self.stop(timeout=0, keep_address=True)
        self._start_once(find_tritonserver(), timeout)

    def python_models(self) -> set[str]:
        """Names of the repository's python-backend models (each runs at least one stub)."""
        if self._python_models is None:
            self._python_models = {
                cfg.parent.name for cfg in self.repository.glob("*/config.pbtxt")
                if re.search(r'^\s*backend\s*:\s*"python"', cfg.read_text(errors="replace"), re.MULTILINE)}
        return self._python_models

    def watch_models(self, report: Callable[[str], None] = print) -> list[str]:
        """One supervision check (supervise.Supervisor): a dead server, a dead or hung stub restarts
        tritonserver. Returns why it restarted (empty when all was well); WideError when it cannot
        come back or keeps failing."""
        from wide_export.tritonserver.supervise import Supervisor

        if self._supervisor is None:
            self._supervisor = Supervisor(self)
        self._supervisor.report = report
        why = self._supervisor.check()
        return [why] if why else []

    def is_ready(self) -> bool:
        """True when the server says it is ready (HTTP /v2/health/ready, or gRPC without HTTP)."""
        if not self.http:
            if self.private_grpc and not os.path.exists(self._grpc_socket()):
                return False  # not listening yet (a connection attempt would wait for it)
            try:
                import tritonclient.grpc as grpcclient

                with grpcclient.InferenceServerClient(self.endpoints.grpc) as client:
                    return bool(client.is_server_ready(client_timeout=READY_TIMEOUT_S))
            except Exception:  # noqa: BLE001 - not up yet
                return False
        url = f"http://{self.address}:{self.http_port}/v2/health/ready"
        try:
            with _DIRECT.open(url, timeout=READY_TIMEOUT_S) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def _answers_are_ours(self) -> bool:
        """The readiness probe's port is held by the tritonserver we started, not by another server that
        held it first (ours then fails to bind and exits: wait_ready reports that)."""
        from wide_export.tritonserver.ports import owns_port

        if self.process is None or self.private_grpc:  # a socket in our own 0700 folder is ours
            return True
        return owns_port([self.process.pid], self.http_port if self.http else self.grpc_port)

    def wait_ready(self, timeout: float) -> None:
        """Poll readiness; a stuck "loading" server (e.g. a broken stub) times out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise WideError(f"tritonserver exited with code {self.process.returncode} before it was ready:\n"
                                f"{self.log_tail()}", hint="read the server log above")
            if self.is_ready() and self._answers_are_ours():
                return
            time.sleep(0.1)
        raise WideError(f"tritonserver was not ready after {timeout:g} s:\n{self.log_tail()}",
                        hint="a model may be stuck loading; read the server log above")

    def log_tail(self, lines: int = 12) -> str:
        """The server's error lines (minus harmless CUDA ones on CPU) and its last lines."""
        text = self.log_text().splitlines()
        head, tail = (text[:-lines], text[-lines:]) if lines > 0 else (text, [])  # text[-0:] is all of it
        errors = [ln for ln in head if ln.startswith("E") and not any(h in ln for h in _HARMLESS)]
        return "\n".join(errors[-10:] + tail)

    def log_text(self) -> str:
        """The whole server log so far."""
        if self.log_path is not None and self.log_path.exists():
            return self.log_path.read_text(errors="replace")
        return self._final_log

    def stop(self, timeout: float = 20.0, keep_address: bool = False) -> Optional[int]:
        """SIGTERM, wait, SIGKILL if needed; remove the private temp dirs (the gRPC socket's too unless
        `keep_address`: a restart). Returns the exit code."""
        code = None
        if self.process is not None:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGTERM if timeout > 0 else signal.SIGKILL)
                try:
                    self.process.wait(max(timeout, 5))
                except subprocess.TimeoutExpired:
                    os.killpg(self.process.pid, signal.SIGKILL)
                    self.process.wait(5)
            code = self.process.returncode
            # The python-backend stubs are in the server's session: reap any left over, once (a second
            # stop must not signal a process group that may since have taken the dead server's pid).
            if self._reaped_group != self.process.pid:
                self._reaped_group = self.process.pid
                try:
                    os.killpg(self.process.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            # A stub that crashed (or was killed) leaves its shared-memory region behind.
            for name in sorted(self._shm_regions):
                try:
                    (SHM_DIR / name).unlink(missing_ok=True)
                except OSError:
                    pass
            self._shm_regions.clear()
        if self._workdir is not None:
            self._keep_log()
            self._workdir.cleanup()
            self._workdir = None
        if self._socket_dir is not None and not keep_address:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
            self._socket_dir = None
        return code

    def _keep_log(self) -> None:
        # Keep the log readable after cleanup (tests print it on failure).
        if self.log_path is not None and self.log_path.exists():
            self._final_log = self.log_path.read_text(errors="replace")
            self.log_path = None

    def serve_until_signal(self, poll: float = 0.5, report: Callable[[str], None] = print,
                           check: Optional[Callable[[], None]] = None,
                           before_stop: Optional[Callable[[], None]] = None) -> int:
        """Block until SIGINT/SIGTERM (then stop cleanly; returns that signal's number) or until the server
        dies (WideError).

        Every `poll` seconds the server is supervised (watch_models): a dead tritonserver, a dead or
        hung stub restarts it; one that cannot come back stops with a WideError. `check`
        runs at each poll as well (it raises to stop, e.g. a frontend that died); `before_stop`
        runs before the server is stopped (e.g. stopping a frontend in front of it).
        """
        from wide_export.base.signals import serve_until_signal

        failing = False  # the supervisor's own checks are failing (reported once per spell)

        def supervise() -> None:
            nonlocal failing
            try:
                self.watch_models(report)
                failing = False
            except WideError:
                raise  # it cannot come back, or keeps failing: serve stops with one line
            except Exception as err:  # noqa: BLE001 - the supervisor's own failure (EMFILE reading /proc, ...)
                # must not take the server down: reported once per failing spell, retried at the next poll
                if not failing:
                    failing = True
                    report(f"supervision check failed ({type(err).__name__}: {err}); retrying")
            if check is not None:
                check()

        def stop() -> None:
            try:
                if before_stop is not None:
                    before_stop()
            finally:
                self.stop()

        return serve_until_signal(poll, supervise, stop)

    def __enter__(self) -> "TritonServer":
        if self.process is not None and self.process.poll() is None:
            return self  # `with TritonServer(...).start() as server:` must not start a second one
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
