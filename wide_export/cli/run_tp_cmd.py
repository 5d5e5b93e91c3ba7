"""`wide-export run-tp`: a sharded export run as one process per rank (torchrun; gloo or NCCL all-reduces)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from wide_export.cli.common import user_errors


def run_tp(
    onnx: Annotated[Path, typer.Option("--onnx", help="Folder from `wide-export onnx --tp N`.")],
    prompt_ids: Annotated[str, typer.Option("--prompt-ids", help="Comma-separated prompt token ids.")],
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="Tokens to generate (greedy).")] = 16,
    backend: Annotated[str, typer.Option("--backend", help="All-reduces over gloo (CPU) or nccl (one GPU per "
                                         "rank).")] = "gloo",
    port: Annotated[Optional[int], typer.Option(
        "--port", help="The ranks' rendezvous port (torchrun's c10d store), reached at 127.0.0.1. Default: a "
                       "free port the system picks. gloo's rank-to-rank sockets stay on the loopback interface; "
                       "torch's stores listen on every interface and the workers' store on a port of its own "
                       "(torchrun has no setting for either).", show_default=False)] = None,
) -> None:
    """Generate greedily from a tensor-parallel export: one process per rank on this machine, each running
    only its rank's graph in ONNX Runtime, the all-reduces done by torch.distributed between them (gloo on the
    CPU, or NCCL on one GPU per rank with --backend nccl).

    The launch is PyTorch's torchrun (`python -m torch.distributed.run --nnodes 1 --rdzv-backend c10d
    --rdzv-endpoint 127.0.0.1:PORT --nproc-per-node N -m wide_export.tp.run ...`), addressed over loopback; for
    several nodes run that module under torchrun yourself (docs/distributed.md).
    """
    import sys

    from wide_export.childproc import run_group
    from wide_export.errors import WideError
    from wide_export.tp.run import BACKENDS, _parse_ids
    from wide_export.tp.verify import read_manifest

    if max_new_tokens < 1:
        raise WideError("--max-new-tokens must be >= 1", "e.g. --max-new-tokens 16")
    _parse_ids(prompt_ids)
    if backend not in BACKENDS:
        raise WideError(f"--backend {backend!r} is not a collective backend", "use --backend gloo or nccl")
    if port is not None and not 1 <= port <= 65535:
        raise WideError(f"--port {port} is not a TCP port", "pass a port from 1 to 65535")
    if not onnx.is_dir():
        raise WideError(f"--onnx {onnx} is not a folder", "pass the output folder of `wide-export onnx --tp N`")
    manifest = read_manifest(onnx)
    world = manifest["world_size"]
    if port is None:
        from wide_export.triton.server import free_port

        port = free_port()
    # One node, reached through loopback: the c10d rendezvous at 127.0.0.1:PORT, the workers' store addressed
    # as 127.0.0.1 (--local-addr; else torchrun names it by the host's FQDN), gloo's pair sockets on `lo`
    # (GLOO_SOCKET_IFNAME; else the host name's interface). torch's TCPStore still listens on every interface,
    # and the workers' store on a port of its own choosing: torchrun has no setting for either.
    rendezvous = ["--nnodes=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=wide-run-tp",
                  "--local-addr=127.0.0.1"]
    cmd = [sys.executable, "-m", "torch.distributed.run", *rendezvous, f"--nproc-per-node={world}",
           "-m", "wide_export.tp.run", "--onnx", str(onnx),
           "--prompt-ids", prompt_ids, "--max-new-tokens", str(max_new_tokens), "--backend", backend]
    import os

    env = {**os.environ, "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo")}
    lines: list[str] = []
    code = run_group(cmd, on_line=lines.append, env=env)
    errors = [ln for ln in lines if ln.startswith("error: ")]
    if code != 0:
        if errors:
            msg, _, hint = errors[0][len("error: "):].partition(" (hint: ")
            raise WideError(msg, hint.rstrip(")") or "see the ranks' output")
        tail = "\n".join(lines[-15:])
        raise WideError(f"the {world} rank processes failed (exit {code}):\n{tail}", "read the ranks' output above")
    ids = [ln for ln in lines if ln and all(c.isdigit() or c == "," for c in ln)]
    typer.echo(ids[-1] if ids else "")


def register(app: typer.Typer) -> None:
    app.command("run-tp")(user_errors(run_tp))
