"""The WIDE forward in PyTorch with an explicit KV cache: the oracle of the project.

The module tree mirrors Hugging Face (`model.layers.{i}.self_attn.q_proj`, ...)
plus `router_attention` / `router_ffn` per layer, so state-dict keys, ONNX
initializer names and ONNX node names all follow the checkpoint. The same
module is traced by the exporter. Every masked projection, router, norm, rotary embedding and attention is
computed by the model's method object (model/methods.py: the reference, which emits `wide` nodes under export, or
the CPU kernels), chosen when the model is built or prepared (`use_method`): the forward itself has no branch on
where it runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from wide_export.base.errors import WideError
from wide_export.model.config import WideConfig
from wide_export.model.methods import REFERENCE, MaskedProjectionMethod
from wide_export.ops.reference import apply_rope, rms_norm, rotate_half, router_logits  # noqa: F401 (re-exported)

KV = tuple[torch.Tensor, torch.Tensor]


class StaticKV:
    """One layer's preallocated KV cache for generation: k, v [B, kvh, capacity, D], the first `length`
    positions filled. Attention writes a step's keys and values in place and attends over the filled view, so
    a decode step copies no past (the tuple cache concatenates it anew each step)."""

    def __init__(self, batch: int, kv_heads: int, capacity: int, head_dim: int, dtype: torch.dtype):
        self.k = torch.zeros(batch, kv_heads, capacity, head_dim, dtype=dtype)
        self.v = torch.zeros_like(self.k)
        self.length = 0

    def append(self, k: torch.Tensor, v: torch.Tensor) -> KV:
        n, t = self.length, k.shape[2]
        if n + t > self.k.shape[2]:
            raise WideError(f"the KV cache holds {self.k.shape[2]} positions, {n + t} were asked for",
                            hint="allocate the cache for prompt + new tokens (static_cache(batch, capacity))")
        self.k[:, :, n:n + t] = k
        self.v[:, :, n:n + t] = v
        self.length = n + t
        return self.k[:, :, :n + t], self.v[:, :, :n + t]


class RMSNorm(nn.Module):
    """Llama RMSNorm: normalise in float32, scale in the input dtype (as transformers; ops/reference.py)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.method: MaskedProjectionMethod = REFERENCE

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.method.rms_norm(self, x)


class Router(nn.Module):
    """WIDE router: compressor H->R then router R->2G; always float32."""

    def __init__(self, hidden: int, rank: int, groups: int):
        super().__init__()
        self.compressor = nn.Linear(hidden, rank, bias=True)
        self.router = nn.Linear(rank, 2 * groups, bias=True)
        self.method: MaskedProjectionMethod = REFERENCE

    @property
    def groups(self) -> int:
        return self.router.out_features // 2

    def params(self) -> tuple[torch.Tensor, ...]:
        return self.compressor.weight, self.compressor.bias, self.router.weight, self.router.bias

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.method.route(self, h)

    def margin(self, h: torch.Tensor) -> torch.Tensor:
        """logit(execute) - logit(skip), float32 [B, T, G]: how far each decision is from a tie."""
        logits = router_logits(h, *self.params())
        return logits[..., 0] - logits[..., 1]


@dataclass
class Collector:
    """Per-layer router masks (and margins) recorded during a reference forward."""

    masks: list[dict[str, torch.Tensor]] = field(default_factory=list)
    margins: list[dict[str, torch.Tensor]] = field(default_factory=list)


class Attention(nn.Module):
    def __init__(self, cfg: WideConfig):
        super().__init__()
        hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.hq, self.hkv, self.d = hq, hkv, d
        self.q_proj = nn.Linear(cfg.hidden_size, hq * d, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, hkv * d, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, hkv * d, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(hq * d, cfg.hidden_size, bias=cfg.o_bias)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(d, cfg.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None
        self.method: MaskedProjectionMethod = REFERENCE

    def forward(self, x, cos, sin, allowed, past: KV | StaticKV, mask, group_heads: int | None):
        b, t, _ = x.shape
        method = self.method
        if mask is None:
            q = method.apply_dense(self.q_proj, x)
        else:
            q = method.apply(self.q_proj, x, mask, group_heads * self.d)
        q = q.view(b, t, self.hq, self.d)
        k = method.apply_dense(self.k_proj, x).view(b, t, self.hkv, self.d)
        v = method.apply_dense(self.v_proj, x).view(b, t, self.hkv, self.d)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = method.rope(q, k, v, cos, sin)  # [B, H, T, D]
        if isinstance(past, StaticKV):
            k, v = past.append(k, v)
            present = past
        else:
            k = torch.cat([past[0], k], dim=2)
            v = torch.cat([past[1], v], dim=2)
            present = (k, v)
        o = method.attend(q, k, v, allowed, mask, group_heads)
        o = o.transpose(1, 2).reshape(b, t, self.hq * self.d)
        if mask is None:
            out = self.o_proj(o)
        else:
            out = method.apply_k(self.o_proj, o, mask, group_heads * self.d)
        return out, present


class MLP(nn.Module):
    def __init__(self, cfg: WideConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.method: MaskedProjectionMethod = REFERENCE

    def forward(self, x, mask, group_size: int | None):
        if mask is None:
            return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))
        y = self.method.apply_gated(self.gate_proj, self.up_proj, x, mask, group_size)
        return self.method.apply_k(self.down_proj, y, mask, group_size)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: WideConfig, index: int):
        super().__init__()
        r = cfg.routing[index]
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)
        self.router_attention = Router(cfg.hidden_size, r.attn_rank, r.attn_groups) if r.attn_groups else None
        self.router_ffn = Router(cfg.hidden_size, r.ffn_rank, r.ffn_groups) if r.ffn_groups else None
        self.attn_group_heads = cfg.attn_group_size(index)
        self.ffn_group_size = cfg.ffn_group_size(index)
        self.force_execute = False  # testing: every group executes (the dense model)
        # tensor parallelism, as a hook on this one decoder (tp/model.py: RankShard): which slice of each router
        # mask this rank's heads / FFN channels are (its projections hold only those), and the sum over the
        # ranks after o_proj and down_proj. None: the whole model on one device.
        self.shard = None

    def _route(self, router: Router | None, h, name: str, collect: Collector | None):
        if router is None:
            return None
        mask = router(h)
        if self.force_execute:
            mask = torch.ones_like(mask)
        if collect is not None:
            collect.masks[-1][name] = mask
            collect.margins[-1][name] = router.margin(h)
        return mask

    def forward(self, h, cos, sin, allowed, past: KV, collect: Collector | None = None):
        if collect is not None:
            collect.masks.append({})
            collect.margins.append({})
        shard = self.shard
        mask_a = self._route(self.router_attention, h, "attention", collect)
        if shard is not None:
            mask_a = shard.attention_mask(mask_a)
        a, present = self.self_attn(self.input_layernorm(h), cos, sin, allowed, past, mask_a, self.attn_group_heads)
        h = h + (a if shard is None else shard.all_reduce(a))
        mask_f = self._route(self.router_ffn, h, "ffn", collect)
        if shard is not None:
            mask_f = shard.ffn_mask(mask_f)
        y = self.mlp(self.post_attention_layernorm(h), mask_f, self.ffn_group_size)
        return h + (y if shard is None else shard.all_reduce(y)), present

    def k_pruned(self) -> list[nn.Linear]:
        """The projections whose input groups the routers prune (o_proj / down_proj of a routed sublayer): those
        a method lays out for its apply_k."""
        return [linear for linear, routed in ((self.self_attn.o_proj, self.attn_group_heads),
                                              (self.mlp.down_proj, self.ffn_group_size)) if routed]


class WideModel(nn.Module):
    def __init__(self, cfg: WideConfig, inv_freq: torch.Tensor, rope_scaling: float = 1.0):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)
        self.rope_scaling = float(rope_scaling)


_TAKES_METHOD = (RMSNorm, Router, Attention, MLP)


class WideForCausalLM(nn.Module):
    """WIDE causal LM with an explicit KV cache (one graph for prefill and decode). It computes with the
    reference method (model/methods.py) until `use_method` gives it another."""

    def __init__(self, cfg: WideConfig, inv_freq: torch.Tensor, rope_scaling: float = 1.0):
        super().__init__()
        self.config = cfg
        self.model = WideModel(cfg, inv_freq, rope_scaling)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.method: MaskedProjectionMethod = REFERENCE

    def use_method(self, method: MaskedProjectionMethod) -> int:
        """Compute with `method` from now on (every layer holds it): its re-layout of the K-pruned projections'
        weights is done here, once per projection (process_weights_after_loading; a projection already laid out
        is left as it is). Call it after the weights are loaded; returns how many projections were laid out."""
        for module in self.modules():
            if isinstance(module, _TAKES_METHOD):
                module.method = method
        self.method = method
        return sum(bool(method.process_weights_after_loading(linear))
                   for layer in self.model.layers for linear in layer.k_pruned())

    @property
    def dtype(self) -> torch.dtype:
        return self.model.embed_tokens.weight.dtype

    def empty_cache(self, batch: int) -> list[KV]:
        """A past of length 0 for prefill."""
        c = self.config
        z = torch.zeros(batch, c.num_key_value_heads, 0, c.head_dim, dtype=self.dtype)
        return [(z, z) for _ in range(c.num_layers)]

    def static_cache(self, batch: int, capacity: int) -> list[StaticKV]:
        """A preallocated cache of `capacity` positions per layer, for generation (StaticKV)."""
        c = self.config
        return [StaticKV(batch, c.num_key_value_heads, capacity, c.head_dim, self.dtype) for _ in range(c.num_layers)]

    def set_force_execute(self, on: bool) -> None:
        """Make every router execute every group (the dense base model), for testing."""
        for layer in self.model.layers:
            layer.force_execute = on

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past_key_values: list[KV] | list[StaticKV],
        collect: Collector | None = None,
    ) -> tuple[torch.Tensor, list[KV]]:
        """logits [B, T, V] float32 and the presents [B, kvh, P+T, D] per layer.

        attention_mask covers past + new tokens ([B, P+T], 1 = real token, 0 = padding).
        past_key_values holds one (key, value) pair per layer; `empty_cache(batch)` for a prefill.
        """
        m = self.model
        if len(past_key_values) != len(m.layers):  # zip() would silently skip every layer
            raise WideError(f"past_key_values has {len(past_key_values)} entries for a model with "
                            f"{len(m.layers)} layers", hint="pass one (key, value) pair per layer; "
                            "model.empty_cache(batch) for a prefill")
        h = m.embed_tokens(input_ids)
        freqs = position_ids[..., None].float() * m.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = (emb.cos() * m.rope_scaling).to(h.dtype)[:, None]
        sin = (emb.sin() * m.rope_scaling).to(h.dtype)[:, None]
        return self.method.run_decoder(self, h, cos, sin, attention_mask, past_key_values, collect)

    def run_layers(self, h, cos, sin, attention_mask, past_key_values, collect=None):
        """forward after the embedding and the rotary angles: every layer op by op, the final norm, the LM head
        (what the method's run_decoder runs unless its fused step serves the call)."""
        m, method = self.model, self.method
        t, s = h.shape[1], attention_mask.shape[1]
        q_pos = torch.arange(t, device=h.device) + (s - t)
        causal = torch.arange(s, device=h.device)[None, :] <= q_pos[:, None]
        allowed = method.attention_mask(causal[None, None] & attention_mask.bool()[:, None, None, :], h.dtype)
        presents = []
        for layer, past in zip(m.layers, past_key_values):
            h, present = layer(h, cos, sin, allowed, past, collect)
            presents.append(present)
        logits = method.apply_dense(self.lm_head, m.norm(h)).float()
        return logits, presents
