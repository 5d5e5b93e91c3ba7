"""WideConfig: the base model's dimensions plus the routing read off router.pth."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from wide_export.base.errors import WideError
from wide_export.model.arch import SUPPORTED_ROPE_TYPES, arch_for, flag


@dataclass
class LayerRouting:
    """Routing of one decoder layer: group counts (None = that sublayer is dense)."""

    attn_groups: int | None = None
    ffn_groups: int | None = None
    attn_rank: int | None = None
    ffn_rank: int | None = None


def rank_groups(groups: int | None, tp: int, rank: int) -> tuple[int, int] | None:
    """The groups of a router's mask that rank `rank` of `tp` holds, [start, end): tensor parallelism splits a
    layer's heads / FFN channels into tp contiguous parts, so each rank holds a contiguous run of whole groups
    (the FFN groups in placement order: export permutes the router's rows). None: no router. The one rule the
    PyTorch decoder's tp hook (tp/model.py) and the vLLM plugin (vllm/model.py) slice masks by."""
    if groups is None:
        return None
    return rank * groups // tp, (rank + 1) * groups // tp


@dataclass
class WideConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    qkv_bias: bool
    qk_norm: bool
    tie_word_embeddings: bool
    rope: dict[str, Any] = field(default_factory=dict)
    routing: list[LayerRouting] = field(default_factory=list)
    o_bias: bool = False  # o_proj has a bias (Llama/Qwen3 `attention_bias`); False in exports before it existed

    # ---- derived -----------------------------------------------------------
    def attn_group_size(self, layer: int) -> int | None:
        """Query heads per attention group (ATTN_G) of a layer, None if dense."""
        g = self.routing[layer].attn_groups
        return None if g is None else self.num_attention_heads // g

    def ffn_group_size(self, layer: int) -> int | None:
        """FFN channels per group (FFN_G) of a layer, None if dense."""
        g = self.routing[layer].ffn_groups
        return None if g is None else self.intermediate_size // g

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "WideConfig":
        d = dict(d)
        d["routing"] = [LayerRouting(**r) for r in d.get("routing", [])]
        return cls(**d)

    @classmethod
    def from_hf(cls, hf: Any) -> "WideConfig":
        """Read the dimensions of a transformers config; refuse what WIDE does not cover."""
        spec = arch_for(getattr(hf, "model_type", None))
        act = getattr(hf, "hidden_act", "silu")
        if act != "silu":
            raise WideError(
                f"hidden_act={act!r} is not supported",
                "WIDE models use a SiLU-gated MLP (hidden_act='silu')",
            )
        if spec.reads_mlp_bias and getattr(hf, "mlp_bias", False):
            raise WideError("mlp_bias=true (gate/up/down biases) is not supported",
                            "WideMaskedGatedMlp has no bias input; attention_bias=true is supported")
        heads = hf.num_attention_heads
        kv = getattr(hf, "num_key_value_heads", None) or heads
        if heads % kv:
            raise WideError(f"num_attention_heads={heads} is not a multiple of num_key_value_heads={kv}",
                            "check config.json")
        head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // heads
        rope = _rope_of(hf)
        return cls(
            model_type=spec.model_type,
            vocab_size=hf.vocab_size,
            hidden_size=hf.hidden_size,
            intermediate_size=hf.intermediate_size,
            num_layers=hf.num_hidden_layers,
            num_attention_heads=heads,
            num_key_value_heads=kv,
            head_dim=head_dim,
            rms_norm_eps=float(hf.rms_norm_eps),
            max_position_embeddings=int(getattr(hf, "max_position_embeddings", 4096)),
            qkv_bias=flag(spec.qkv_bias, hf, "attention_bias"),
            o_bias=flag(spec.o_bias, hf, "attention_bias"),
            qk_norm=spec.qk_norm,
            tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
            rope=rope,
            routing=[LayerRouting() for _ in range(hf.num_hidden_layers)],
        )


def _rope_of(hf: Any) -> dict[str, Any]:
    params = getattr(hf, "rope_parameters", None) or getattr(hf, "rope_scaling", None) or {}
    params = dict(params)
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise WideError(
            f"RoPE type {rope_type!r} is not supported",
            f"supported: {', '.join(SUPPORTED_ROPE_TYPES)} (dynamic/longrope change with sequence length)",
        )
    params.setdefault("rope_theta", getattr(hf, "rope_theta", 10000.0))
    params["rope_type"] = rope_type
    return {k: v for k, v in params.items() if isinstance(v, (int, float, str, bool, type(None)))}
