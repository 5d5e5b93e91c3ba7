"""Build a WideForCausalLM from a real WIDE checkpoint, or the embedded demo model."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from wide_export.base.checksum import sha256_of
from wide_export.base.errors import WideError

Progress = Callable[[str], None]


@dataclass
class LoadedModel:
    """A loaded WIDE model and where it came from."""

    model: Any  # WideForCausalLM
    is_demo: bool
    sources: dict[str, dict[str, Any]] = field(default_factory=dict)  # role -> {path, sha256, bytes}
    lora_pairs: int = 0
    lora_scale: float | None = None
    weights: Any = None  # lazy.WeightSource when `model` holds placeholders (load_wide_model(lazy=True))
    model_dir: Path | None = None  # the folder as given (a Hugging Face snapshot's files resolve elsewhere)

    @property
    def config(self):
        return self.model.config


def load_wide_model(
    model_dir: Path | None = None,
    *,
    router: Path | None = None,
    lora: Path | None = None,
    lora_scale: float = 2.0,
    attn_group_size: int | None = None,
    ffn_group_size: int | None = None,
    dtype: str = "float32",
    progress: Progress | None = None,
    checksums: bool = True,
    lazy: bool = False,
    check_finite: bool = False,
) -> LoadedModel:
    """Load base weights, routers and (optionally) merge LoRA; the demo model when model_dir is None.

    lazy=True reads no weights: the model holds placeholders and `.weights` produces each tensor on
    demand (checkpoint/lazy.py), with the same checks; the demo model is always built in memory.
    check_finite: refuse a weight holding NaN or infinity (in `dtype`, LoRA merged) by name, as the CPU
    generation path does (one pass over the weights; not with lazy=True: the GGUF writer checks each
    tensor as it writes it)."""
    import torch

    say = progress or (lambda _msg: None)
    if dtype not in ("float32", "float16", "bfloat16"):
        raise WideError(f"unsupported dtype {dtype!r}", "use float32, float16 or bfloat16")
    torch_dtype = getattr(torch, dtype)
    from wide_export.checkpoint.lora import check_lora_scale

    lora_scale = check_lora_scale(lora_scale)
    if model_dir is None:
        if router or lora:
            raise WideError("--router/--lora need --model", "pass the base model folder with --model DIR")
        from wide_export.checkpoint.demo import demo_model
        from wide_export.checkpoint.router import check_group_flags

        model = demo_model(dtype=torch_dtype)
        check_group_flags(model.config, attn_group_size, ffn_group_size)
        return LoadedModel(model, is_demo=True)

    from wide_export.checkpoint.hf import (
        check_companion_files, check_layer_count, iter_tensors, read_hf_config, safetensors_files,
    )
    from wide_export.checkpoint.router import read_routers
    from wide_export.model.build import build_model
    from wide_export.model.config import WideConfig
    from wide_export.base.paths import confined

    model_dir = Path(model_dir)
    hf = read_hf_config(model_dir)
    check_companion_files(model_dir)
    shards = safetensors_files(model_dir)
    check_layer_count(shards, hf.num_hidden_layers, model_dir / "config.json")  # before building layers
    cfg = WideConfig.from_hf(hf)
    if not router:  # the default is a file of the model folder: it must lie inside it
        router = model_dir / "router.pth"
        confined(router, model_dir, "router file")
    router = Path(router)
    from wide_export.base.inputs import check_router_file

    check_router_file(router)  # the line the CLI gives while parsing --router
    say(f"reading routers from {router.name}")
    routers = read_routers(router, cfg, attn_group_size, ffn_group_size)
    if lazy:
        say(f"indexing {len(shards)} safetensors shard(s)")
        from wide_export.checkpoint.lazy import open_lazy

        model, weights = open_lazy(hf, cfg, shards, routers, torch_dtype, lora, lora_scale)
        pairs = len(weights.lora)
    else:
        say(f"loading {len(shards)} safetensors shard(s)")
        model, weights = build_model(hf, cfg, iter_tensors(shards), routers, torch_dtype), None
        pairs = 0
    if lora and not lazy:
        say(f"merging LoRA from {Path(lora).name} (scale {lora_scale})")
        from wide_export.checkpoint.lora import merge_lora

        pairs = merge_lora(model, Path(lora), lora_scale)
    if check_finite and not lazy:
        say("checking that the weights are finite")
        check_finite_weights(model, model_dir, dtype, merged=bool(lora))
    files = {"config": model_dir / "config.json", "router": router, **({"lora": Path(lora)} if lora else {})}
    files.update({f"weights:{s.name}": s for s in shards})
    if checksums:
        say("hashing source files")
    sources = {role: _describe(p, checksums) for role, p in files.items()}
    model.eval()
    return LoadedModel(model, is_demo=False, sources=sources, lora_pairs=pairs,
                       lora_scale=lora_scale if lora else None, weights=weights, model_dir=model_dir)


def check_finite_weights(model, model_dir: Path, dtype: str, merged: bool = False) -> None:
    """One WideError naming the first weight of `model` that holds NaN or infinity."""
    import torch

    for name, param in model.named_parameters():
        if not bool(torch.isfinite(param).all()):
            raise WideError(f"{model_dir}: weight {name} holds NaN or infinite values (in {dtype}"
                            + (", LoRA merged" if merged else "") + ")",
                            "the checkpoint is damaged or its training diverged: use another checkpoint"
                            + (", or float32 if the values overflow the 16-bit range" if dtype != "float32" else ""))


def _describe(path: Path, checksum: bool) -> dict[str, Any]:
    info: dict[str, Any] = {"path": str(Path(path).resolve()), "bytes": Path(path).stat().st_size}
    if checksum:
        info["sha256"] = sha256_of(path)
    return info
