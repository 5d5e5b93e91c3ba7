"""The `wide` ops as the reference method calls them (model/methods.py): eager -> PyTorch reference, export ->
custom node.

Under `torch.onnx.export(dynamo=True)` each call becomes ONE node of domain `wide` (torch.onnx.ops.symbolic); its
function body is attached afterwards (wide_export/ops/functions.py). Which method a model runs (the reference
and its ONNX symbolic, the CPU kernels, vLLM's) is chosen when the model is built or prepared, not here: this
module knows the op set only (docs/architecture.md, "The masked-projection layer and its methods").
"""

from __future__ import annotations

import torch

from wide_export.ops import reference as ref
from wide_export.ops.spec import DOMAIN, OPSET_VERSION, plugin_attrs


def exporting() -> bool:
    """Whether torch.onnx.export is tracing: calls then become `wide` nodes."""
    return torch.onnx.is_in_onnx_export()


def masked_attention(q, k, v, allowed, head_mask, group_heads: int):
    """One WideMaskedAttention node (q [B, Hq, T, D], k / v [B, Hk, S, D], allowed bool [B, 1, T, S], head_mask
    int32 [B, T, G]): what a reference method made with attention_op=True traces a routed layer's attention as."""
    return _symbolic("WideMaskedAttention", [q, k, v, allowed, head_mask], {"group_heads": group_heads}, q.dtype,
                     tuple(q.shape))


def _symbolic(op: str, inputs: list, attrs: dict, dtype: torch.dtype, shape) -> torch.Tensor:
    return torch.onnx.ops.symbolic(
        f"{DOMAIN}::{op}", inputs, attrs=plugin_attrs(**attrs), dtype=dtype, shape=shape, version=OPSET_VERSION
    )


def router(hidden, wc, bc, wr, br) -> torch.Tensor:
    """int32 [B, T, G] execute mask."""
    groups = wr.shape[0] // 2
    if exporting():
        shape = (*hidden.shape[:-1], groups)
        return _symbolic("WideRouter", [hidden, wc, bc, wr, br], {"num_groups": groups}, torch.int32, shape)
    return ref.wide_router(hidden, wc, bc, wr, br)


def gemm_n(x, w, mask, group_size: int, bias=None) -> torch.Tensor:
    if exporting():
        # The bias input is always wired (zeros when absent): see docs/opset.md.
        b = bias if bias is not None else torch.zeros(w.shape[0], dtype=x.dtype)
        attrs = {"group_size": group_size, "has_bias": int(bias is not None)}
        return _symbolic("WideMaskedGemmN", [x, w, mask, b], attrs, x.dtype, (*x.shape[:-1], w.shape[0]))
    return ref.masked_gemm_n(x, w, mask, group_size, bias)


def gated_mlp(x, w_gate, w_up, mask, group_size: int) -> torch.Tensor:
    if exporting():
        return _symbolic("WideMaskedGatedMlp", [x, w_gate, w_up, mask], {"group_size": group_size}, x.dtype,
                         (*x.shape[:-1], w_gate.shape[0]))
    return ref.masked_gated_mlp(x, w_gate, w_up, mask, group_size)


def gemm_k(x, w, mask, group_size: int, bias=None) -> torch.Tensor:
    if exporting():
        b = bias if bias is not None else torch.zeros(w.shape[0], dtype=x.dtype)  # always wired, as gemm_n
        attrs = {"group_size": group_size, "has_bias": int(bias is not None)}
        return _symbolic("WideMaskedGemmK", [x, w, mask, b], attrs, x.dtype, (*x.shape[:-1], w.shape[0]))
    return ref.masked_gemm_k(x, w, mask, group_size, bias)
