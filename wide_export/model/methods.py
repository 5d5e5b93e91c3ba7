"""How the decoder computes its masked projections: one method object per model, chosen when the model is built
or prepared (as vLLM's LinearMethodBase / FusedMoEMethodBase: the layer holds the weights, its method computes
with them).

    model.use_method(CpuKernelsMethod())   # o_proj / down_proj laid out as W^T once; every call runs the kernels

The decoder (modeling.py) calls `self.method` for each masked projection (the q projection's output groups, the
gated MLP's channel groups, o_proj's / down_proj's input groups), the router, the unrouted projections the method
may serve, and the runtime pieces around them (RMSNorm, rotary embedding, attention, the attention mask, the
whole decoder after the embedding: where a fused decode step may take over). It has no branch of its own on
where it runs. A method's weight re-layout happens once, in process_weights_after_loading, when the model takes
the method (WideForCausalLM.use_method).

Methods (docs/architecture.md, "The masked-projection layer and its methods"):

* ReferenceMethod: the PyTorch reference (ops/reference.py), the oracle; under torch.onnx.export each call is
  one `wide` node (ops/dispatch.py: the ONNX symbolic), with attention_op=True a routed layer's attention too.
  Every model starts with it.
* CpuKernelsMethod: wide_export.cpu's compiled kernels (fast CPU generation and serving); K-pruned weights
  stored as W^T; the fused decode step (cpu/step.py). A call it cannot serve (a tensor not on the CPU, an
  export's trace, an op that declines) runs the reference.
* vLLM's methods (wide_export/vllm/methods.py) subclass MaskedProjectionMethod for vLLM's own layers; the CPU
  one lays weights out with CpuKernelsMethod.transposed.
* GPU kernels (wide_export.kernels, OpenAI Triton) have no method for this decoder: nothing runs the reference
  decoder on a GPU but verification, which wants the reference. A `GpuKernelsMethod(ReferenceMethod)` would
  override route / apply / apply_gated / apply_k with kernels.launch's router / masked_gated_mlp / masked_gemm_k
  (vLLM's VllmTritonMethod calls them today).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from wide_export.ops import dispatch
from wide_export.ops.reference import apply_rope, attention, rms_norm


class MaskedProjectionMethod:
    """The interface. `layer` is a projection module (weight [N, K], bias or None), `mask` an int32 [.., G]
    execute mask (group g owns channels g * group_size .. (g + 1) * group_size - 1, docs/opset.md)."""

    name = "abstract"

    def process_weights_after_loading(self, layer: torch.nn.Module) -> bool:
        """Lay a K-pruned projection's (o_proj / down_proj of a routed sublayer) weight out for apply_k; called
        once per projection when the model takes the method, and harmless again (a weight already laid out is
        left as it is). Whether this call changed the layout."""
        return False

    def route(self, router, h: torch.Tensor) -> torch.Tensor:
        """The router's int32 execute mask [.., G] of h (router.compressor / router.router: weight and bias)."""
        raise NotImplementedError

    def apply(self, layer, x, mask, group_size: int) -> torch.Tensor:
        """Output groups (q_proj): x W^T + b with the outputs of skipped groups exactly 0."""
        raise NotImplementedError

    def apply_gated(self, gate, up, x, mask, group_size: int) -> torch.Tensor:
        """Channel groups of the gated MLP: silu(x Wg^T) * (x Wu^T), the channels of skipped groups 0."""
        raise NotImplementedError

    def apply_k(self, layer, x, mask, group_size: int) -> torch.Tensor:
        """Input groups (o_proj, down_proj): x W^T + b over the input groups each token executes."""
        raise NotImplementedError

    def apply_dense(self, layer, x) -> torch.Tensor:
        """A projection without groups that the method may serve (k, v, an unrouted q, the LM head)."""
        raise NotImplementedError

    def rms_norm(self, norm, x) -> torch.Tensor:
        raise NotImplementedError

    def rope(self, q, k, v, cos, sin) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Rotary embedding of q [B, T, Hq, D] and k [B, T, Hk, D]; q, k and v returned with the heads first
        ([B, H, T, D])."""
        raise NotImplementedError

    def attention_mask(self, allowed: torch.Tensor, dtype: torch.dtype):
        """What `attend` takes of the bool mask [B, 1, T, S] (causal and padding), made once for every layer."""
        raise NotImplementedError

    def attend(self, q, k, v, allowed, mask, group_heads: int | None) -> torch.Tensor:
        """Attention of q [B, Hq, T, D] over k / v [B, Hk, S, D]; mask: the layer's head-group mask or None."""
        raise NotImplementedError

    def run_decoder(self, model, h, cos, sin, attention_mask, past_key_values, collect):
        """(logits, presents) of a modeling.WideForCausalLM from its embedded tokens h: model.run_layers, or a
        method's fused step."""
        return model.run_layers(h, cos, sin, attention_mask, past_key_values, collect)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class ReferenceMethod(MaskedProjectionMethod):
    """The PyTorch reference (the oracle); under torch.onnx.export each masked projection and router is one
    `wide` node, and with attention_op=True a routed layer's attention is one WideMaskedAttention node (heads of
    skipped groups 0; `wide-export onnx --attention-op`). Eager calls are the reference either way."""

    name = "reference"

    def __init__(self, attention_op: bool = False):
        self.attention_op = attention_op

    def route(self, router, h):
        c, r = router.compressor, router.router
        return dispatch.router(h, c.weight, c.bias, r.weight, r.bias)

    def apply(self, layer, x, mask, group_size: int):
        return dispatch.gemm_n(x, layer.weight, mask, group_size, layer.bias)

    def apply_gated(self, gate, up, x, mask, group_size: int):
        return dispatch.gated_mlp(x, gate.weight, up.weight, mask, group_size)

    def apply_k(self, layer, x, mask, group_size: int):
        return dispatch.gemm_k(x, layer.weight, mask, group_size, layer.bias)

    def apply_dense(self, layer, x):
        return layer(x)

    def rms_norm(self, norm, x):
        return rms_norm(x, norm.weight, norm.eps)

    def rope(self, q, k, v, cos, sin):
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def attention_mask(self, allowed, dtype):
        return allowed

    def attend(self, q, k, v, allowed, mask, group_heads):
        if self.attention_op and mask is not None and dispatch.exporting():
            return dispatch.masked_attention(q, k, v, allowed, mask, group_heads)
        return attention(q, k, v, allowed)

    def __repr__(self) -> str:
        return f"ReferenceMethod(attention_op={self.attention_op})"


REFERENCE = ReferenceMethod()  # every model's method until it takes another (stateless: shared)


def attention_floor(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    """The additive attention mask of a boolean one (0 where allowed, the dtype's lowest value where not, a
    finite floor as the reference's attention), or None where every position is allowed."""
    if bool(allowed.all()):
        return None
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)


class CpuKernelsMethod(ReferenceMethod):
    """wide_export.cpu's compiled kernels (docs/cpu.md): the masked projections skip the weights of skipped
    groups (or run the dense GEMM + mask where the CPU's measured policy says so), RMSNorm / rotary embedding /
    decode attention / the router are fused ops, torch's fused attention serves the rest, and a decode step of
    the whole model is one call (cpu/step.py; fused_step=False: op by op). Each routed o_proj / down_proj is
    stored as W^T [K, N] (process_weights_after_loading; the module keeps `weight` as the [N, K] view of it, so
    the reference and every other reader see the same values): each input group's weights one contiguous block
    for the K-pruned kernel, the dense GEMM of a prefill reading the same storage. One copy of the weights.

    A call on a tensor that is not on the CPU, or traced by an export, runs the reference (and its ONNX
    symbolic); so does an op that declines (kernels not built, a dtype or layout they do not take)."""

    name = "cpu"
    DTYPES = (torch.float32, torch.bfloat16, torch.float16)

    def __init__(self, fused_step: bool = True):
        super().__init__()
        from wide_export.cpu import ops, step

        self.ops, self.step, self.fused_step = ops, step, fused_step

    @staticmethod
    def transposed(weight: torch.Tensor) -> torch.Tensor:
        """W^T [K, N] contiguous of a K-pruned projection's weight [N, K]: the one re-layout (vLLM's CPU method
        keeps it as its own buffer)."""
        return weight.t().contiguous()

    def process_weights_after_loading(self, layer) -> bool:
        w = layer.weight
        if w.dim() != 2 or not w.is_contiguous() or w.dtype not in self.DTYPES or not self.ops.available():
            return False  # laid out already (the [N, K] view of W^T), or not a layout / dtype of the kernels
        layer.weight.data = self.transposed(w.data).t()
        return True

    @staticmethod
    def _here(x: torch.Tensor) -> bool:
        return x.device.type == "cpu" and not dispatch.exporting()

    def route(self, router, h):
        if not self._here(h):
            return super().route(router, h)
        c, r = router.compressor, router.router
        return self.ops.router(h, c.weight, c.bias, r.weight, r.bias)

    def apply(self, layer, x, mask, group_size: int):
        if not self._here(x):
            return super().apply(layer, x, mask, group_size)
        return self.ops.masked_gemm_n(x, layer.weight, mask, group_size, layer.bias)

    def apply_gated(self, gate, up, x, mask, group_size: int):
        if not self._here(x):
            return super().apply_gated(gate, up, x, mask, group_size)
        return self.ops.masked_gated_mlp(x, gate.weight, up.weight, mask, group_size)

    def apply_k(self, layer, x, mask, group_size: int):
        if not self._here(x):
            return super().apply_k(layer, x, mask, group_size)
        return self.ops.masked_gemm_k(x, layer.weight, mask, group_size, layer.bias)  # W^T's view: gemm_kt

    def apply_dense(self, layer, x):
        if not self._here(x):
            return super().apply_dense(layer, x)
        return self.ops.dense_linear(x, layer.weight, layer.bias)

    def rms_norm(self, norm, x):
        if self._here(x) and (y := self.ops.rms_norm(x, norm.weight, norm.eps)) is not None:
            return y
        return super().rms_norm(norm, x)

    def rope(self, q, k, v, cos, sin):
        if self._here(q) and self.ops.rope_(q, k, cos, sin):  # in place, before the heads move to dim 1
            return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        return super().rope(q, k, v, cos, sin)

    def attention_mask(self, allowed, dtype):
        if not self._here(allowed):
            return super().attention_mask(allowed, dtype)
        return attention_floor(allowed, dtype)  # torch's fused attention takes the additive floor

    def attend(self, q, k, v, allowed, mask, group_heads):
        if not self._here(q):
            return super().attend(q, k, v, allowed, mask, group_heads)
        # the decode step's attention without skipped heads, else torch's fused attention (allowed: the additive
        # floor, None when every position is allowed), KV heads shared
        if allowed is None and (o := self.ops.decode_attention(q, k, v, mask, group_heads or 1)) is not None:
            return o
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, enable_gqa=q.shape[1] != k.shape[1])

    def run_decoder(self, model, h, cos, sin, attention_mask, past_key_values, collect):
        # a decode step of the whole model in one call (cpu/step.py), which declines (None, nothing written) where
        # it does not serve; recording router masks runs op by op
        if self.fused_step and collect is None and self._here(h) and \
                (logits := self.step.decode_step(model, h, cos, sin, attention_mask, past_key_values)) is not None:
            return logits, list(past_key_values)
        return super().run_decoder(model, h, cos, sin, attention_mask, past_key_values, collect)

    def __reduce__(self):  # copied and pickled by its settings (it holds modules, which neither can)
        return type(self), (self.fused_step,)

    def __repr__(self) -> str:
        return f"CpuKernelsMethod(fused_step={self.fused_step})"
