"""The `wide` ops as called by the model: eager -> PyTorch reference, export -> custom node.

Under `torch.onnx.export(dynamo=True)` each call becomes ONE node of domain
`wide` (torch.onnx.ops.symbolic); its function body is attached afterwards
(wide_export/ops/functions.py).
"""

from __future__ import annotations

import contextlib

import torch

from wide_export.ops import reference as ref
from wide_export.ops.spec import DOMAIN, OPSET_VERSION, plugin_attrs


_FAST_CPU = [False]  # cpu_kernels(): eager calls on CPU tensors go to wide_export.cpu
_ATTENTION_OP = [False]  # attention_op(): the export traces a routed layer's attention as one WideMaskedAttention


def _exporting() -> bool:
    return torch.onnx.is_in_onnx_export()


@contextlib.contextmanager
def cpu_kernels(enabled: bool = True):
    """Within the block, eager calls on CPU tensors run wide_export.cpu (the compiled kernels that skip the
    weights of skipped groups, or dense + mask where its policy says) instead of the PyTorch reference. For
    generation that must be fast; verification keeps the reference (outside the block), its oracle."""
    before = _FAST_CPU[0]
    _FAST_CPU[0] = enabled
    try:
        yield
    finally:
        _FAST_CPU[0] = before


@contextlib.contextmanager
def attention_op(enabled: bool = True):
    """Within the block, an export traces the attention of each layer with an attention router as one
    `wide::WideMaskedAttention` node (heads of skipped groups 0; its function body is the model's attention in
    standard ops) instead of those standard ops inline. Eager calls are unchanged."""
    before = _ATTENTION_OP[0]
    _ATTENTION_OP[0] = enabled
    try:
        yield
    finally:
        _ATTENTION_OP[0] = before


def masked_attention(q, k, v, allowed, head_mask, group_heads: int):
    """Under an export inside attention_op(): one WideMaskedAttention node (q [B, Hq, T, D], k / v [B, Hk, S,
    D], allowed bool [B, 1, T, S], head_mask int32 [B, T, G]); else None: the caller runs its attention."""
    if not (_ATTENTION_OP[0] and _exporting()):
        return None
    return _symbolic("WideMaskedAttention", [q, k, v, allowed, head_mask], {"group_heads": group_heads}, q.dtype,
                     tuple(q.shape))


def fast_cpu(x) -> bool:
    """Whether calls on `x` take the fast CPU path (inside cpu_kernels(), a CPU tensor, not exporting)."""
    return _FAST_CPU[0] and x.device.type == "cpu" and not _exporting()


def _cpu_ops():
    """wide_export.cpu.ops, imported on first use (a decode step calls it ~100 times: no import statement per
    call)."""
    if not _CPU_OPS:
        from wide_export.cpu import ops, step

        _CPU_OPS.extend((ops, step.decode_step))
    return _CPU_OPS[0]


_CPU_OPS: list = []


def cpu_layer_ops(x):
    """wide_export.cpu.ops when calls on `x` take the fast CPU path (its fused rms_norm / rope_ /
    decode_attention, each of which may still decline a call), else None: the model then runs its reference."""
    return _cpu_ops() if fast_cpu(x) else None


def cpu_decode_step(x):
    """wide_export.cpu.step.decode_step (a decode step of the model in one call, which may decline) when calls on
    `x` take the fast CPU path, else None."""
    if not fast_cpu(x):
        return None
    _cpu_ops()
    return _CPU_OPS[1]


def _symbolic(op: str, inputs: list, attrs: dict, dtype: torch.dtype, shape) -> torch.Tensor:
    return torch.onnx.ops.symbolic(
        f"{DOMAIN}::{op}", inputs, attrs=plugin_attrs(**attrs), dtype=dtype, shape=shape, version=OPSET_VERSION
    )


def router(hidden, wc, bc, wr, br) -> torch.Tensor:
    """int32 [B, T, G] execute mask."""
    groups = wr.shape[0] // 2
    if _exporting():
        shape = (*hidden.shape[:-1], groups)
        return _symbolic("WideRouter", [hidden, wc, bc, wr, br], {"num_groups": groups}, torch.int32, shape)
    if fast_cpu(hidden):
        return _cpu_ops().router(hidden, wc, bc, wr, br)
    return ref.wide_router(hidden, wc, bc, wr, br)


def linear(layer: torch.nn.Linear, x) -> torch.Tensor:
    """A projection without groups (k, v, the LM head, a layer without routers): the module itself, or on the
    fast CPU path the masked kernel with its one group executed where the CPU's measured policy says that beats
    torch's GEMM at this many tokens (wide_export.cpu.dense_linear)."""
    if fast_cpu(x):
        return _cpu_ops().dense_linear(x, layer.weight, layer.bias)
    return layer(x)


def gemm_n(x, w, mask, group_size: int, bias=None) -> torch.Tensor:
    if _exporting():
        # The bias input is always wired (zeros when absent): see docs/opset.md.
        b = bias if bias is not None else torch.zeros(w.shape[0], dtype=x.dtype)
        attrs = {"group_size": group_size, "has_bias": int(bias is not None)}
        return _symbolic("WideMaskedGemmN", [x, w, mask, b], attrs, x.dtype, (*x.shape[:-1], w.shape[0]))
    if fast_cpu(x):
        return _cpu_ops().masked_gemm_n(x, w, mask, group_size, bias)
    return ref.masked_gemm_n(x, w, mask, group_size, bias)


def gated_mlp(x, w_gate, w_up, mask, group_size: int) -> torch.Tensor:
    if _exporting():
        return _symbolic("WideMaskedGatedMlp", [x, w_gate, w_up, mask], {"group_size": group_size}, x.dtype,
                         (*x.shape[:-1], w_gate.shape[0]))
    if fast_cpu(x):
        return _cpu_ops().masked_gated_mlp(x, w_gate, w_up, mask, group_size)
    return ref.masked_gated_mlp(x, w_gate, w_up, mask, group_size)


def gemm_k(x, w, mask, group_size: int, bias=None) -> torch.Tensor:
    if _exporting():
        b = bias if bias is not None else torch.zeros(w.shape[0], dtype=x.dtype)  # always wired, as gemm_n
        attrs = {"group_size": group_size, "has_bias": int(bias is not None)}
        return _symbolic("WideMaskedGemmK", [x, w, mask, b], attrs, x.dtype, (*x.shape[:-1], w.shape[0]))
    if fast_cpu(x):
        return _cpu_ops().masked_gemm_k(x, w, mask, group_size, bias)
    return ref.masked_gemm_k(x, w, mask, group_size, bias)
