"""Random-weight WIDE checkpoints of the real architectures, made offline from a seed.

Used by the demo model, the tests (which write real HF folders + router.pth +
lora.pth and read them back through the loader) and the benchmarks.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wide_export.model.arch import ARCHS

HF_CONFIGS = {t: a.hf_config_class for t, a in ARCHS.items()}  # model_type -> transformers config class name
HF_MODELS = {t: a.hf_model_class for t, a in ARCHS.items()}


@dataclass
class SyntheticSpec:
    """Shape of a random WIDE model; `sparse_target` is all, attention or ffn."""

    arch: str = "llama"
    vocab_size: int = 256
    hidden_size: int = 64
    intermediate_size: int = 192
    num_layers: int = 2
    num_heads: int = 8
    num_kv_heads: int = 2
    head_dim: int | None = None  # None: hidden / heads
    attn_groups: int = 4
    ffn_groups: int = 12
    rank: int = 16
    sparse_target: str = "all"
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 512
    attention_bias: bool = False  # config `attention_bias` (llama/qwen3: q, k, v and o_proj biases)
    mlp_bias: bool = False  # config `mlp_bias` (llama; refused by the loader)
    seed: int = 0

    def hf_config(self) -> Any:
        import transformers

        cls = getattr(transformers, HF_CONFIGS[self.arch])
        kw = dict(
            vocab_size=self.vocab_size, hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_layers, num_attention_heads=self.num_heads,
            num_key_value_heads=self.num_kv_heads, max_position_embeddings=self.max_position_embeddings,
            tie_word_embeddings=self.tie_word_embeddings, rms_norm_eps=1e-5, hidden_act="silu",
        )
        if self.head_dim is not None:
            kw["head_dim"] = self.head_dim
        if self.attention_bias:
            kw["attention_bias"] = True
        if self.mlp_bias:
            kw["mlp_bias"] = True
        return cls(**kw)

    def routed(self, kind: str) -> bool:
        return self.sparse_target in ("all", kind)


def random_base_state(spec: SyntheticSpec) -> dict[str, Any]:
    """HF-named base weights with a spread that gives decisive logits (std 1/sqrt(fan_in))."""
    import torch
    import transformers

    torch.manual_seed(spec.seed)
    with torch.device("meta"):
        hf_model = getattr(transformers, HF_MODELS[spec.arch])(spec.hf_config())
    g = torch.Generator().manual_seed(spec.seed)
    state = {}
    for name, p in hf_model.state_dict().items():
        if name.endswith("norm.weight"):
            state[name] = 1.0 + 0.1 * torch.randn(p.shape, generator=g)
        elif name.endswith(".bias"):
            state[name] = 0.1 * torch.randn(p.shape, generator=g)
        elif "embed_tokens" in name:
            state[name] = torch.randn(p.shape, generator=g)
        else:
            state[name] = torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5
    if spec.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    return state


def random_router_state(spec: SyntheticSpec, prefix: str = "", dtype=None) -> dict[str, Any]:
    """router.pth content: both or one router per layer, logits ~ N(0, 1) so about half the groups run."""
    import torch

    g = torch.Generator().manual_seed(spec.seed + 1)
    out = {}
    for i in range(spec.num_layers):
        for kind, groups in (("attention", spec.attn_groups), ("ffn", spec.ffn_groups)):
            if not spec.routed(kind):
                continue
            base = f"{prefix}model.layers.{i}.router_{kind}"
            out[f"{base}.compressor.weight"] = torch.randn(spec.rank, spec.hidden_size, generator=g) / spec.hidden_size**0.5
            out[f"{base}.compressor.bias"] = 0.1 * torch.randn(spec.rank, generator=g)
            out[f"{base}.router.weight"] = torch.randn(2 * groups, spec.rank, generator=g) / spec.rank**0.5
            out[f"{base}.router.bias"] = 0.1 * torch.randn(2 * groups, generator=g)
    if dtype is not None:
        out = {k: v.to(dtype) for k, v in out.items()}
    return out


def random_lora_state(spec: SyntheticSpec, r: int = 4, prefix: str = "base_model.model.") -> dict[str, Any]:
    """lora.pth content (PEFT-style keys) on q/o/gate/down of every layer."""
    import torch

    g = torch.Generator().manual_seed(spec.seed + 2)
    head_dim = spec.head_dim or spec.hidden_size // spec.num_heads
    shapes = {
        "self_attn.q_proj": (spec.num_heads * head_dim, spec.hidden_size),
        "self_attn.o_proj": (spec.hidden_size, spec.num_heads * head_dim),
        "mlp.gate_proj": (spec.intermediate_size, spec.hidden_size),
        "mlp.down_proj": (spec.hidden_size, spec.intermediate_size),
    }
    out = {}
    for i in range(spec.num_layers):
        for proj, (n, k) in shapes.items():
            base = f"{prefix}model.layers.{i}.{proj}"
            out[f"{base}.lora_A.default.weight"] = torch.randn(r, k, generator=g) / k**0.5
            out[f"{base}.lora_B.default.weight"] = 0.05 * torch.randn(n, r, generator=g)
    return out


def write_checkpoint(folder: Path, spec: SyntheticSpec, *, lora: bool = False,
                     router_prefix: str = "_fsdp_wrapped_module.base_model.model.") -> Path:
    """Write a WIDE checkpoint like the trainer's: HF folder + router.pth (bf16) [+ lora.pth]."""
    import torch
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    spec.hf_config().save_pretrained(folder)
    state = random_base_state(spec)
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"),
              metadata={"format": "pt"})
    torch.save(random_router_state(spec, router_prefix, torch.bfloat16), folder / "router.pth")
    if lora:
        torch.save(random_lora_state(spec), folder / "lora.pth")
    return folder
