"""Run a sharded export as one process per rank with real all-reduces: the per-rank-plan route's process
layout (docs/distributed.md), on CPU.

Every process loads ITS rank's graph only (`OUT/rank{r}/model.onnx`), runs it in ONNX Runtime stage by
stage (cut at its DistCollective nodes, as `verify` does) and, at each collective, calls
`torch.distributed.all_reduce` (gloo on CPU) on the stage's partial output: the ranks exchange tensors
through the collective library, nothing is summed in one place. Greedy decoding with the KV cache;
every rank computes the same next token (the logits are replicated after the last all-reduce), rank 0
prints them.

Launched by PyTorch's own launcher, which also spans nodes:

    torchrun --nproc-per-node N -m wide_export.tp.run --onnx OUT --prompt-ids 1,2,3 --max-new-tokens 16
    torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d --rdzv-endpoint HOST:29500 -m wide_export.tp.run ...

or `wide-export run-tp --onnx OUT ...`, which starts that torchrun for one node (N = the export's ranks).
`--backend nccl` (one CUDA GPU per rank) does the all-reduces with NCCL on the ranks' GPUs: the exchange
between GPUs of the per-rank-plan route; the stages still run in ONNX Runtime on the CPU. With TensorRT 11
the stages become per-rank plans (not available here: see docs/distributed.md, Limits).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from wide_export.base.errors import WideError


def _check_collective(node) -> None:
    attrs = {a.name: a for a in node.attribute}
    op = attrs.get("collective_operation")
    red = attrs.get("reduce_op")
    if op is None or op.s != b"all_reduce" or red is None or red.s != b"sum":
        raise WideError(f"DistCollective {node.name} is not an all_reduce sum", "re-run `wide-export onnx --tp N`")


class RankGenerator:
    """One rank of a sharded export, fed step by step; `all_reduce(array)` returns the sum over the ranks."""

    def __init__(self, onnx_dir: Path, rank: int, world_size: int, all_reduce: Callable[[np.ndarray], np.ndarray]):
        from wide_export.export.onnx_export import read_wide_config
        from wide_export.tp.ranks import RankRunner, read_manifest

        manifest = read_manifest(onnx_dir)
        if manifest["world_size"] != world_size:
            raise WideError(f"{onnx_dir} has {manifest['world_size']} ranks but {world_size} processes were started",
                            f"start {manifest['world_size']} processes (torchrun --nproc-per-node "
                            f"{manifest['world_size']})")
        folder = Path(onnx_dir) / manifest["ranks"][rank]["folder"]
        self.config = read_wide_config(folder)
        if self.config["dtype"] == "bfloat16":
            raise WideError("ONNX Runtime on CPU cannot run a bfloat16 export", "export with --dtype float32 or float16")
        self.runner = RankRunner(folder, [])
        for node in self.runner.collectives:
            _check_collective(node)
        self.all_reduce = all_reduce
        self.kv_dtype = np.float16 if self.config["dtype"] == "float16" else np.float32

    def step(self, feed: dict) -> dict:
        env = dict(feed)
        for s, stage in enumerate(self.runner.stages):
            self.runner.run_stage(s, env)
            if stage.collective is not None:
                env[stage.collective.output[0]] = self.all_reduce(env[stage.collective.input[0]])
        return env

    def generate(self, prompt: Sequence[int], max_new_tokens: int, eos: Sequence[int] = ()) -> list[int]:
        """Greedy: prefill the prompt, then one token per step with the KV cache (batch 1), through the one
        generation loop (wide_export/generation/decoding.py), the ranks' graphs as its step."""
        from wide_export.generation.decoding import decode_loop

        cfg = self.config
        n_layers, kvh, hd = cfg["num_layers"], cfg["num_key_value_heads"], cfg["head_dim"]
        past = {f"past_key_values.{i}.{kv}": np.zeros((1, kvh, 0, hd), self.kv_dtype)
                for i in range(n_layers) for kv in ("key", "value")}

        def step(ids: np.ndarray, mask: np.ndarray, pos: np.ndarray) -> np.ndarray:
            env = self.step({"input_ids": ids, "attention_mask": mask, "position_ids": pos, **past})
            past.update({f"past_key_values.{i}.{kv}": env[f"present.{i}.{kv}"] for i in range(n_layers)
                         for kv in ("key", "value")})
            return env["logits"]

        new = decode_loop(step, np.asarray([list(prompt)], dtype=np.int64), None, max_new_tokens,
                          stop=lambda ids: int(ids[0]) in eos)
        return new[0].tolist()


BACKENDS = ("gloo", "nccl")


def torch_all_reduce(device: str | None = None) -> Callable[[np.ndarray], np.ndarray]:
    """The sum over the ranks through torch.distributed: on `device` (NCCL: this rank's GPU) or on the CPU
    (gloo). The tensor travels to the device and back; the ONNX Runtime stages stay on the CPU."""
    import torch
    import torch.distributed as dist

    def all_reduce(array: np.ndarray) -> np.ndarray:
        t = torch.from_numpy(np.ascontiguousarray(array))
        if device is not None:
            t = t.to(device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t.cpu().numpy()

    return all_reduce


def check_backend(backend: str, local_rank: int, local_world: int) -> str | None:
    """The device this rank's all-reduces run on (None: the CPU); one line when the backend cannot run here."""
    if backend not in BACKENDS:
        raise WideError(f"--backend {backend!r} is not a collective backend", "use --backend gloo or nccl")
    if backend == "gloo":
        return None
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count < local_world:
        raise WideError(f"--backend nccl needs one CUDA GPU per rank: {local_world} rank(s) on this node, "
                        f"{count} GPU(s) visible to torch", "use --backend gloo (CPU), or run on a node with "
                        f"{local_world} GPUs and a CUDA build of torch")
    return f"cuda:{local_rank}"


def _parse_ids(text: str) -> list[int]:
    try:
        ids = [int(v) for v in text.replace(" ", "").split(",") if v]
    except ValueError:
        raise WideError(f"--prompt-ids {text!r} is not a comma-separated list of token ids",
                        "e.g. --prompt-ids 1,15043,29871") from None
    if not ids or min(ids) < 0:
        raise WideError("--prompt-ids needs at least one non-negative token id", "e.g. --prompt-ids 1,15043,29871")
    return ids


def main(argv: list[str] | None = None) -> int:
    """One rank (RANK / WORLD_SIZE and MASTER_ADDR / MASTER_PORT from torchrun, or WIDE_TP_INIT from run-tp)."""
    p = argparse.ArgumentParser(prog="python -m wide_export.tp.run", description=__doc__.split("\n\n")[0])
    p.add_argument("--onnx", required=True, type=Path, help="a `wide-export onnx --tp N` folder")
    p.add_argument("--prompt-ids", required=True, help="comma-separated token ids")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--json", action="store_true", help="rank 0 prints one JSON line instead of the ids")
    p.add_argument("--backend", default="gloo", help="torch.distributed backend of the all-reduces: gloo (CPU) or "
                   "nccl (one GPU per rank)")
    args = p.parse_args(argv)
    try:
        return _run(args)
    except WideError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


def _run(args) -> int:
    import torch.distributed as dist

    from wide_export.tp.launch import INIT_ENV

    init = os.environ.get(INIT_ENV)  # `wide-export run-tp`: a FileStore; torchrun: its TCPStore (MASTER_*)
    for name in ("RANK", "WORLD_SIZE") + (() if init else ("MASTER_ADDR", "MASTER_PORT")):
        if name not in os.environ:
            raise WideError(f"{name} is not set: this module runs as one rank of a torchrun launch",
                            f"torchrun --nproc-per-node N -m wide_export.tp.run --onnx {args.onnx} ... "
                            "(or `wide-export run-tp`)")
    if args.max_new_tokens < 1:
        raise WideError("--max-new-tokens must be >= 1", "e.g. --max-new-tokens 16")
    prompt = _parse_ids(args.prompt_ids)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    device = check_backend(args.backend, local_rank, int(os.environ.get("LOCAL_WORLD_SIZE", world)))
    # errors before the group forms: every rank sees them and exits
    gen = RankGenerator(args.onnx, rank, world, torch_all_reduce(device))
    vocab = gen.config["vocab_size"]
    if max(prompt) >= vocab:
        raise WideError(f"token id {max(prompt)} is not below the vocabulary size {vocab}", "check --prompt-ids")
    if device is not None:
        import torch

        torch.cuda.set_device(device)
    if init:
        dist.init_process_group(args.backend, init_method=init, rank=rank, world_size=world)
    else:
        dist.init_process_group(args.backend)
    try:
        tokens = gen.generate(prompt, args.max_new_tokens)
    finally:
        dist.destroy_process_group()
    if rank == 0:
        if args.json:
            print(json.dumps({"prompt_ids": prompt, "output_ids": tokens, "world_size": world,
                              "backend": args.backend}), flush=True)
        else:
            print(",".join(map(str, tokens)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
