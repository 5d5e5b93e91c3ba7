"""`wide-export run-tp`: a sharded export run as one process per rank (gloo or NCCL all-reduces)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from wide_export.cli.common import user_errors


def run_tp(
    onnx: Annotated[Path, typer.Option("--onnx", help="Folder from `wide-export onnx --tp N`.")],
    prompt_ids: Annotated[str, typer.Option("--prompt-ids", help="Comma-separated prompt token ids.")],
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="Tokens to generate (greedy).")] = 16,
    backend: Annotated[str, typer.Option("--backend", help="All-reduces over gloo (CPU) or nccl (one GPU per "
                                         "rank).")] = "gloo",
) -> None:
    """Generate greedily from a tensor-parallel export: one process per rank on this machine, each running
    only its rank's graph in ONNX Runtime, the all-reduces done by torch.distributed between them (gloo on the
    CPU, or NCCL on one GPU per rank with --backend nccl).

    The ranks meet through a file store in a private temporary folder and exchange their partial sums over
    the loopback interface: nothing listens beyond 127.0.0.1 and no port is to be chosen. For several nodes
    run `python -m wide_export.tp.run` under torchrun yourself (docs/distributed.md).
    """
    from wide_export.base.errors import WideError
    from wide_export.tp.launch import run_ranks
    from wide_export.tp.run import BACKENDS, _parse_ids
    from wide_export.tp.ranks import read_manifest

    if max_new_tokens < 1:
        raise WideError("--max-new-tokens must be >= 1", "e.g. --max-new-tokens 16")
    _parse_ids(prompt_ids)
    if backend not in BACKENDS:
        raise WideError(f"--backend {backend!r} is not a collective backend", "use --backend gloo or nccl")
    if not onnx.is_dir():
        raise WideError(f"--onnx {onnx} is not a folder", "pass the output folder of `wide-export onnx --tp N`")
    manifest = read_manifest(onnx)
    world = manifest["world_size"]
    args = ["--onnx", str(onnx), "--prompt-ids", prompt_ids, "--max-new-tokens", str(max_new_tokens),
            "--backend", backend]
    lines: list[str] = []
    code = run_ranks(world, args, on_line=lines.append)
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
