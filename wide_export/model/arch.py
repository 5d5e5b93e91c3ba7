"""Supported base architectures: one declarative row per Hugging Face `model_type`.

Adding an architecture means adding a row here (and a test), not `if`s elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass

from wide_export.base.errors import WideError


@dataclass(frozen=True)
class ArchSpec:
    """What differs between the Llama-style families we support."""

    model_type: str
    qkv_bias: bool | None  # q/k/v biases: True/False fixed by the family, None: read `attention_bias` from the config
    o_bias: bool | None  # o_proj bias: likewise (transformers' Llama and Qwen3 give all four a bias with attention_bias)
    qk_norm: bool  # per-head RMSNorm on q and k after the projection (Qwen3)
    examples: str
    hf_prefix: str  # transformers class prefix: {prefix}Config, {prefix}ForCausalLM, {prefix}RotaryEmbedding
    genai_type: str  # onnxruntime-genai's model.type
    reads_mlp_bias: bool = False  # the family's MLP reads config `mlp_bias` (refused when true: see config.py)

    @property
    def hf_module(self) -> str:
        return f"transformers.models.{self.model_type}.modeling_{self.model_type}"

    @property
    def hf_config_class(self) -> str:
        return f"{self.hf_prefix}Config"

    @property
    def hf_model_class(self) -> str:
        return f"{self.hf_prefix}ForCausalLM"

    @property
    def vllm_architecture(self) -> str:
        """The architecture name a `wide-export vllm` folder declares and the vLLM plugin registers."""
        return f"Wide{self.hf_prefix}ForCausalLM"

    @property
    def hf_rotary_class(self) -> str:
        """The family's own rotary embedding (inv_freq and attention scaling exactly as transformers computes)."""
        return f"{self.hf_prefix}RotaryEmbedding"


ARCHS: dict[str, ArchSpec] = {
    a.model_type: a
    for a in (
        ArchSpec("llama", qkv_bias=None, o_bias=None, qk_norm=False, examples="Llama 2, 3, 3.1, 3.2",
                 hf_prefix="Llama", genai_type="llama", reads_mlp_bias=True),
        # transformers' MistralAttention has no bias whatever `attention_bias` says
        ArchSpec("mistral", qkv_bias=False, o_bias=False, qk_norm=False, examples="Mistral 7B", hf_prefix="Mistral",
                 genai_type="mistral"),
        ArchSpec("qwen2", qkv_bias=True, o_bias=False, qk_norm=False, examples="Qwen2, Qwen2.5", hf_prefix="Qwen2",
                 genai_type="qwen2"),
        ArchSpec("qwen3", qkv_bias=None, o_bias=None, qk_norm=True, examples="Qwen3 dense", hf_prefix="Qwen3",
                 genai_type="qwen3"),
    )
}

SUPPORTED_ROPE_TYPES = ("default", "llama3", "linear", "yarn")


def flag(fixed: bool | None, hf, key: str) -> bool:
    """A table entry: the family's fixed value, or (None) the config's `key`."""
    return fixed if fixed is not None else bool(getattr(hf, key, False))


def arch_for(model_type: str | None) -> ArchSpec:
    """The table row for `model_type`, or a WideError naming what is supported."""
    try:
        return ARCHS[str(model_type)]
    except KeyError:
        raise WideError(
            f"unsupported architecture model_type={model_type!r}",
            f"wide-export supports {', '.join(sorted(ARCHS))} (Llama-style decoders with RMSNorm, RoPE, GQA, SiLU MLP)",
        ) from None
