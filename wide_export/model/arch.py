"""Supported base architectures: one declarative row per Hugging Face `model_type`.

Adding an architecture means adding a row here (and a test), not `if`s elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass

from wide_export.errors import WideError


@dataclass(frozen=True)
class ArchSpec:
    """What differs between the Llama-style families we support."""

    model_type: str
    qkv_bias: bool | None  # True/False fixed by the family, None: read `attention_bias` from the config
    qk_norm: bool  # per-head RMSNorm on q and k after the projection (Qwen3)
    examples: str


ARCHS: dict[str, ArchSpec] = {
    a.model_type: a
    for a in (
        ArchSpec("llama", qkv_bias=None, qk_norm=False, examples="Llama 2, 3, 3.1, 3.2"),
        ArchSpec("mistral", qkv_bias=False, qk_norm=False, examples="Mistral 7B"),
        ArchSpec("qwen2", qkv_bias=True, qk_norm=False, examples="Qwen2, Qwen2.5"),
        ArchSpec("qwen3", qkv_bias=None, qk_norm=True, examples="Qwen3 dense"),
    )
}

SUPPORTED_ROPE_TYPES = ("default", "llama3", "linear", "yarn")


def arch_for(model_type: str | None) -> ArchSpec:
    """The table row for `model_type`, or a WideError naming what is supported."""
    try:
        return ARCHS[str(model_type)]
    except KeyError:
        raise WideError(
            f"unsupported architecture model_type={model_type!r}",
            f"wide-export supports {', '.join(sorted(ARCHS))} (Llama-style decoders with RMSNorm, RoPE, GQA, SiLU MLP)",
        ) from None
