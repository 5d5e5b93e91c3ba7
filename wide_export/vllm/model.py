"""WIDE on vLLM's own layers: one model class for every family of model/arch.py's table.

Built from vLLM's parallel linear layers, RMSNorm, rotary embedding, paged
Attention, embedding and LM head, so vLLM's engine features (paged KV cache,
prefix caching, chunked prefill, continuous batching, torch.compile, tensor and
pipeline parallelism: tested on CPU; CUDA graphs, LoRA adapters, online
quantisation: untested) apply as to its own Llama. Pre-quantised checkpoints are
not loaded: load_weights refuses tensors the folder's config does not describe. What WIDE adds (README, "Bring
your own checkpoint"):

* per layer up to two routers, float32, replicated on every rank; each reads the
  pre-norm residual stream: vLLM's fused add+RMSNorm returns it as `residual`;
* the attention output's heads of skipped groups are zeroed before o_proj, the
  FFN channels of skipped groups before down_proj. Under tensor parallelism a
  rank holds a contiguous slice of the heads (QKVParallelLinear) and of the FFN
  channels (MergedColumnParallelLinear), so it applies that slice of the mask:
  spec.check_world refuses a size that would split a group.

Three paths compute the same thing. `native` (any device): the mask multiplies the
activations and vLLM's layers run as they are. `triton` (CUDA, unquantised layers
without LoRA wrappers): the router and the masked gate/up and down GEMMs run our
Triton kernels as torch custom ops (ops.py), which skip the weights of skipped
groups. `cpu` (vLLM's CPU backend, unquantised, no LoRA adapters): q_proj,
gate/up + SiLU, o_proj and down_proj of routed sublayers run wide_export.cpu's
compiled kernels as custom ops; those layers keep their own weight layout
(q/k/v and gate/up as loaded, o_proj / down_proj as W^T [K, N], read by the
K-pruned kernel and the dense GEMM alike) instead of vLLM's repacked copy, so
the weights stay one copy. o_proj / down_proj partial sums are all-reduced as
RowParallelLinear does.
`--additional-config '{"wide_kernels": "auto|native|triton|cpu"}'` or `WIDE_VLLM_KERNELS`; auto = triton
on CUDA, cpu on CPU.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from itertools import islice

import torch
from torch import nn
from vllm.compilation.decorators import support_torch_compile
from vllm.config import VllmConfig
from vllm.distributed import (get_pp_group, get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size,
                              tensor_model_parallel_all_reduce)
from vllm.logger import init_logger
from vllm.model_executor.layers.activation import SiluAndMul
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import (MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear,
                                               UnquantizedLinearMethod)
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.rotary_embedding import get_rope
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from vllm.model_executor.model_loader.weight_utils import default_weight_loader
from vllm.model_executor.models.interfaces import SupportsLoRA, SupportsPP
from vllm.model_executor.models.utils import (PPMissingLayer, extract_layer_index, is_pp_missing_parameter,
                                              make_empty_intermediate_tensors_factory, make_layers, maybe_prefix)
from vllm.sequence import IntermediateTensors

from wide_export.errors import WideError
from wide_export.model.config import rank_groups
from wide_export.ops.reference import expand_mask, wide_router
from wide_export.vllm.spec import HINT, check_world, config_from_hf, router_shapes

logger = init_logger(__name__)
KERNELS_ENV = "WIDE_VLLM_KERNELS"
# HF weight name part -> (vLLM fused parameter part, shard id), as vLLM's Llama loads them
STACKED = ((".qkv_proj", ".q_proj", "q"), (".qkv_proj", ".k_proj", "k"), (".qkv_proj", ".v_proj", "v"),
           (".gate_up_proj", ".gate_proj", 0), (".gate_up_proj", ".up_proj", 1))


MODES = ("auto", "native", "triton", "cpu")


def kernel_mode(vllm_config: VllmConfig) -> str:
    """'native', 'triton' or 'cpu': `--additional-config '{"wide_kernels": ...}'`, else WIDE_VLLM_KERNELS; auto
    (the default) = triton on CUDA, cpu on CPU. The choice is written into additional_config, which vLLM hashes
    into its compile-cache key: a graph compiled in one mode is never reloaded in another (the environment
    variable alone is not part of that key)."""
    extra = vllm_config.additional_config if isinstance(vllm_config.additional_config, dict) else {}
    mode = extra.get("wide_kernels") or os.environ.get(KERNELS_ENV, "auto")
    if mode not in MODES:
        raise ValueError(f"WIDE: kernels {mode!r} (additional_config wide_kernels / {KERNELS_ENV}): "
                         f"choose one of {', '.join(MODES)}")
    if mode == "auto":
        mode = {"cuda": "triton", "cpu": "cpu"}.get(vllm_config.device_config.device_type, "native")
    if isinstance(vllm_config.additional_config, dict):
        vllm_config.additional_config["wide_kernels"] = mode
    return mode


def _fail(err: WideError) -> ValueError:
    return ValueError(f"WIDE: {err}")


def _plain(layer: nn.Module, cls: type) -> bool:
    """`layer` is vLLM's own `cls`, unquantised, not wrapped by LoRA, and keeps its [N, K] weight (vLLM's CPU
    backend repacks it for its own GEMM and empties `weight`): our kernels can read that weight."""
    weight = getattr(layer, "weight", None)
    return (type(layer) is cls and isinstance(getattr(layer, "quant_method", None), UnquantizedLinearMethod)
            and isinstance(weight, torch.Tensor) and weight.dim() == 2)


def _cpu_layers(vllm_config: VllmConfig) -> str | None:
    """Why routed sublayers cannot run wide_export.cpu's kernels (None: they can): they need unquantised
    weights of float32 or bfloat16 (the kernels' dtypes), no LoRA adapters (their wrappers call the layer's
    own GEMM on `weight`), and the kernels built (a C++ compiler)."""
    from wide_export import cpu

    if vllm_config.quant_config is not None or vllm_config.lora_config is not None:
        return "quantised layers or LoRA adapters"
    if vllm_config.model_config.dtype not in (torch.float32, torch.bfloat16):
        return f"dtype {str(vllm_config.model_config.dtype).replace('torch.', '')} (the kernels take float32, bfloat16)"
    if not cpu.available():  # it has printed why
        return "the kernels could not be built"
    return None


def _own_weight(*layers: nn.Module) -> None:
    """Keep vLLM's CPU backend from repacking these layers' weights for its GEMM (and emptying `weight`): our
    kernels read them (vLLM's flag for layers whose weight another op reads; their own GEMM is F.linear)."""
    for layer in layers:
        layer._cpu_skip_gemm_dispatch = True


def _transpose_k(layer: nn.Module) -> None:
    """Replace a K-pruned layer's [N, K] weight with W^T [K, N] contiguous, kept as `layer.wide_kt`: each input
    group's weights one contiguous block for the CPU kernel (wide_export.cpu.masked_gemm_kt), and the dense
    GEMM's operand as it is, so prefill and decode share one copy of the weight."""
    w = layer.weight.data
    if w.dim() != 2 or w.numel() == 0:
        return  # not loaded as [N, K]: the op transposes per call
    layer.register_buffer("wide_kt", w.t().contiguous(), persistent=False)
    layer.weight = nn.Parameter(w.new_empty(0), requires_grad=False)


def _split_kv(layer: QKVParallelLinear, q_size: int) -> None:
    """Split a routed qkv layer's weight after load: the q rows stay ours (`layer.wide_q`, read by the masked
    kernel), the k and v rows go to vLLM's own CPU GEMM (`layer.wide_kv`: the one its dense layers get, oneDNN
    on a weight it prepacks), which at a batch of tokens is much faster than F.linear on the plain rows. Each
    row is kept once. Where vLLM has no such dispatch, the rows stay in `weight` and F.linear reads them."""
    w = layer.weight.data
    if w.dim() != 2 or w.numel() == 0:
        return
    try:
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
    except ImportError:
        return
    kv = nn.Module()
    kv.weight = nn.Parameter(w[q_size:].clone(), requires_grad=False)
    dispatch_cpu_unquantized_gemm(kv, remove_weight=True)
    if not callable(getattr(kv, "cpu_linear", None)):
        return
    layer.register_buffer("wide_q", w[:q_size].clone(), persistent=False)
    layer.wide_kv = kv
    layer.weight = nn.Parameter(w.new_empty(0), requires_grad=False)


def _kt(layer: nn.Module) -> torch.Tensor:
    kt = getattr(layer, "wide_kt", None)
    return layer.weight.t() if kt is None else kt


class _Affine(nn.Module):
    """weight [out, in] and bias [out], float32, replicated; a folder tensor of another shape is refused."""

    def __init__(self, out_features: int, in_features: int, name: str):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=torch.float32), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features, dtype=torch.float32), requires_grad=False)
        for p in (self.weight, self.bias):
            p.weight_loader = self._load
        self.name = name

    def _load(self, param: nn.Parameter, tensor: torch.Tensor) -> None:
        leaf = "weight" if param is self.weight else "bias"
        if tuple(tensor.shape) != tuple(param.shape):
            raise ValueError(f"WIDE: {self.name}.{leaf} has shape {list(tensor.shape)} in the folder, its "
                             f"config.json `wide` section implies {list(param.shape)} (hint: {HINT})")
        if tensor.dtype != torch.float32:
            raise ValueError(f"WIDE: {self.name}.{leaf} is {str(tensor.dtype).replace('torch.', '')} in the folder; "
                             f"router tensors are float32 (hint: {HINT})")
        if not bool(torch.isfinite(tensor).all()):
            raise ValueError(f"WIDE: {self.name}.{leaf} holds non-finite values (NaN or Inf) (hint: {HINT})")
        param.data.copy_(tensor)


class WideRouter(nn.Module):
    """route(h): z = h Wc^T + bc, l = z Wr^T + br as [T, G, 2]; group g executes iff l[g, 0] >= l[g, 1]."""

    def __init__(self, shapes: dict[str, tuple[int, ...]], prefix: str, kernels: bool):
        super().__init__()
        rank, hidden = shapes["compressor.weight"]
        self.compressor = _Affine(rank, hidden, f"{prefix}.compressor")
        self.router = _Affine(shapes["router.weight"][0], rank, f"{prefix}.router")
        from wide_export.kernels.configs import router_block_r

        self.kernels = kernels and bool(router_block_r(rank))  # the fused router's rank limit: native above it

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """The int32 mask [T, G] for the whole model (every rank takes its slice): the kernel, or the rule
        itself (ops/reference.py's wide_router, the PyTorch decoder's oracle)."""
        c, r = self.compressor, self.router
        if self.kernels:
            return torch.ops.wide_vllm.router(h, c.weight, c.bias, r.weight, r.bias)
        return wide_router(h, c.weight, c.bias, r.weight, r.bias)


def _zero_skipped(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """x [T, G * gs] with the channels of groups where mask [T, G] is off set to 0 (group g owns channels
    g * gs .. (g + 1) * gs - 1: ops/reference.py's expand_mask, the rule of every masked op)."""
    return x * expand_mask(mask, x.shape[-1] // mask.shape[-1], x.dtype)


def _row_parallel(layer: RowParallelLinear, y: torch.Tensor) -> torch.Tensor:
    """Finish a row-parallel product computed outside the layer: sum over ranks, then the bias once."""
    if layer.tp_size > 1:
        y = tensor_model_parallel_all_reduce(y)
    if layer.bias is not None:
        y = y + layer.bias
    return y


class WideAttention(nn.Module):
    def __init__(self, hf, cfg, layer: int, cache_config, quant_config, prefix: str, mode: str):
        super().__init__()
        tp = get_tensor_model_parallel_world_size()
        self.head_dim = cfg.head_dim
        self.num_heads = cfg.num_attention_heads // tp
        self.num_kv_heads = max(1, cfg.num_key_value_heads // tp)
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.qkv_proj = QKVParallelLinear(cfg.hidden_size, self.head_dim, cfg.num_attention_heads,
                                          cfg.num_key_value_heads, bias=cfg.qkv_bias, quant_config=quant_config,
                                          prefix=f"{prefix}.qkv_proj")
        self.o_proj = RowParallelLinear(cfg.num_attention_heads * self.head_dim, cfg.hidden_size, bias=cfg.o_bias,
                                        quant_config=quant_config, prefix=f"{prefix}.o_proj")
        if cfg.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, eps=cfg.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, eps=cfg.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None
        rope = getattr(hf, "rope_parameters", None) or {"rope_type": "default",
                                                         "rope_theta": getattr(hf, "rope_theta", 10000.0)}
        self.rotary_emb = get_rope(self.head_dim, max_position=cfg.max_position_embeddings,
                                   rope_parameters=rope, is_neox_style=True)
        self.attn = Attention(self.num_heads, self.head_dim, self.head_dim**-0.5, num_kv_heads=self.num_kv_heads,
                              cache_config=cache_config, quant_config=quant_config, prefix=f"{prefix}.attn")
        heads = cfg.attn_group_size(layer)
        self.group_width = None if heads is None else heads * self.head_dim  # o_proj input channels per group
        self.mode = mode if heads is not None else "native"
        if self.mode == "cpu":
            _own_weight(self.qkv_proj, self.o_proj)

    def after_load(self) -> None:
        """o_proj's weight as W^T, k and v rows to vLLM's CPU GEMM (mode cpu)."""
        if self.mode == "cpu":
            _transpose_k(self.o_proj)
            _split_kv(self.qkv_proj, self.q_size)

    def _qk_norm(self, x: torch.Tensor, norm: RMSNorm) -> torch.Tensor:
        by_head = x.view(*x.shape[:-1], x.shape[-1] // self.head_dim, self.head_dim)
        return norm(by_head).view(x.shape)

    def _qkv_cpu(self, x: torch.Tensor, mask: torch.Tensor):
        """q of the executed head groups only (the others' q is 0: their attention output is never read), k
        and v dense (the KV cache stays complete)."""
        layer, q = self.qkv_proj, self.q_size
        b, split = layer.bias, getattr(layer, "wide_kv", None)
        wq = layer.weight[:q] if split is None else layer.wide_q
        qs = torch.ops.wide_vllm.cpu_gemm_n(x, wq, mask, self.group_width, None if b is None else b[:q])
        bkv = None if b is None else b[q:]
        kv = nn.functional.linear(x, layer.weight[q:], bkv) if split is None else split.cpu_linear(x, None, bkv)
        k, v = kv.split([self.kv_size, self.kv_size], dim=-1)
        return qs, k, v

    def forward(self, positions: torch.Tensor, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        if mask is not None and self.mode == "cpu":
            q, k, v = self._qkv_cpu(x, mask)
        else:
            qkv, _ = self.qkv_proj(x)
            q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.q_norm is not None:
            q, k = self._qk_norm(q, self.q_norm), self._qk_norm(k, self.k_norm)
        q, k = self.rotary_emb(positions, q, k)
        o = self.attn(q, k, v)
        if mask is None:
            return self.o_proj(o)[0]
        if self.mode == "cpu":
            return _row_parallel(self.o_proj, torch.ops.wide_vllm.cpu_gemm_kt(o, _kt(self.o_proj), mask,
                                                                              self.group_width))
        if self.mode == "triton" and _plain(self.o_proj, RowParallelLinear):
            return _row_parallel(self.o_proj, torch.ops.wide_vllm.masked_gemm_k(o, self.o_proj.weight, mask,
                                                                                 self.group_width))
        return self.o_proj(_zero_skipped(o, mask))[0]


class WideMLP(nn.Module):
    def __init__(self, cfg, layer: int, quant_config, prefix: str, mode: str):
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(cfg.hidden_size, [cfg.intermediate_size] * 2, bias=False,
                                                       quant_config=quant_config, prefix=f"{prefix}.gate_up_proj")
        self.down_proj = RowParallelLinear(cfg.intermediate_size, cfg.hidden_size, bias=False,
                                           quant_config=quant_config, prefix=f"{prefix}.down_proj")
        self.act_fn = SiluAndMul()
        self.group_size = cfg.ffn_group_size(layer)
        self.mode = mode if self.group_size is not None else "native"
        if self.mode == "cpu":
            _own_weight(self.gate_up_proj, self.down_proj)

    def after_load(self) -> None:
        """down_proj's weight as W^T (mode cpu)."""
        if self.mode == "cpu":
            _transpose_k(self.down_proj)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        if mask is not None and self.mode == "cpu":
            w = self.gate_up_proj.weight
            n = w.shape[0] // 2  # this rank's channels: gate rows, then up rows
            y = torch.ops.wide_vllm.cpu_gated(x, w[:n], w[n:], mask, self.group_size)
            return _row_parallel(self.down_proj, torch.ops.wide_vllm.cpu_gemm_kt(y, _kt(self.down_proj), mask,
                                                                                 self.group_size))
        if mask is not None and self.mode == "triton" and _plain(self.gate_up_proj, MergedColumnParallelLinear) \
                and _plain(self.down_proj, RowParallelLinear):
            w = self.gate_up_proj.weight
            n = w.shape[0] // 2
            y = torch.ops.wide_vllm.masked_gated_mlp(x, w[:n], w[n:], mask, self.group_size)
            return _row_parallel(self.down_proj, torch.ops.wide_vllm.masked_gemm_k(y, self.down_proj.weight, mask,
                                                                                    self.group_size))
        y = self.act_fn(self.gate_up_proj(x)[0])
        if mask is not None:
            y = _zero_skipped(y, mask)
        return self.down_proj(y)[0]


class WideDecoderLayer(nn.Module):
    def __init__(self, vllm_config: VllmConfig, cfg, prefix: str, mode: str):
        super().__init__()
        hf = vllm_config.model_config.hf_config
        quant_config = vllm_config.quant_config
        self.index = layer = extract_layer_index(prefix)
        kernels = mode == "triton"  # the router's Triton kernel; on CPU the router is two small torch GEMMs
        self.self_attn = WideAttention(hf, cfg, layer, vllm_config.cache_config, quant_config,
                                       f"{prefix}.self_attn", mode)
        self.mlp = WideMLP(cfg, layer, quant_config, f"{prefix}.mlp", mode)
        self.input_layernorm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        r, tp, rank = cfg.routing[layer], get_tensor_model_parallel_world_size(), get_tensor_model_parallel_rank()
        self.router_attention = self.router_ffn = None
        self.attn_slice = self.ffn_slice = (0, 0)
        if r.attn_groups is not None:
            self.router_attention = WideRouter(router_shapes(cfg, layer, "attention"), f"{prefix}.router_attention",
                                               kernels)
            self.attn_slice = rank_groups(r.attn_groups, tp, rank)  # the groups of this rank's query heads
        if r.ffn_groups is not None:
            self.router_ffn = WideRouter(router_shapes(cfg, layer, "ffn"), f"{prefix}.router_ffn", kernels)
            self.ffn_slice = rank_groups(r.ffn_groups, tp, rank)  # the groups of this rank's FFN channels

    @staticmethod
    def _route(router: WideRouter | None, h: torch.Tensor, part: tuple[int, int]) -> torch.Tensor | None:
        if router is None:
            return None
        return router(h)[:, part[0]:part[1]]

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor,
                residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        # `residual` is now the stream entering the layer, before the norm: what the attention router reads
        mask = self._route(self.router_attention, residual, self.attn_slice)
        hidden_states = self.self_attn(positions, hidden_states, mask)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        mask = self._route(self.router_ffn, residual, self.ffn_slice)  # the stream after the attention add
        return self.mlp(hidden_states, mask), residual


def wide_config(vllm_config: VllmConfig):
    """The WideConfig of the folder being loaded, checked against the tensor-parallel size (ValueError)."""
    try:
        cfg = config_from_hf(vllm_config.model_config.hf_config)
        check_world(cfg, get_tensor_model_parallel_world_size())
    except WideError as err:
        raise _fail(err) from None
    return cfg


@support_torch_compile(dynamic_arg_dims={"input_ids": 0, "positions": -1, "intermediate_tensors": 0,
                                         "inputs_embeds": 0})
class WideModel(nn.Module):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__()
        hf = vllm_config.model_config.hf_config
        self.wide = cfg = wide_config(vllm_config)
        self.config = hf
        mode = kernel_mode(vllm_config)
        if mode == "cpu":
            why = _cpu_layers(vllm_config)
            if why is None:
                from wide_export import cpu

                logger.info("WIDE: the CPU kernels (%s) serve the routed projections", cpu.isa())
            else:
                logger.warning("WIDE: the masked projections run native on CPU (%s)", why)
                mode = "native"
        pp = get_pp_group()
        if pp.is_first_rank or (cfg.tie_word_embeddings and pp.is_last_rank):
            self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size,
                                                       quant_config=vllm_config.quant_config)
        else:
            self.embed_tokens = PPMissingLayer()
        self.start_layer, self.end_layer, self.layers = make_layers(
            cfg.num_layers, lambda prefix: WideDecoderLayer(vllm_config, cfg, prefix, mode),
            prefix=f"{prefix}.layers")
        self.norm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps) if pp.is_last_rank else PPMissingLayer()
        self.make_empty_intermediate_tensors = make_empty_intermediate_tensors_factory(
            ["hidden_states", "residual"], cfg.hidden_size)
        if mode != "native":
            import wide_export.vllm.ops  # noqa: F401  registers torch.ops.wide_vllm

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor,
                intermediate_tensors: IntermediateTensors | None = None,
                inputs_embeds: torch.Tensor | None = None) -> torch.Tensor | IntermediateTensors:
        if get_pp_group().is_first_rank:
            hidden_states = inputs_embeds if inputs_embeds is not None else self.embed_input_ids(input_ids)
            residual = None
        else:
            hidden_states, residual = intermediate_tensors["hidden_states"], intermediate_tensors["residual"]
        for layer in islice(self.layers, self.start_layer, self.end_layer):
            hidden_states, residual = layer(positions, hidden_states, residual)
        if not get_pp_group().is_last_rank:
            return IntermediateTensors({"hidden_states": hidden_states, "residual": residual})
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states


def _readable(weights: Iterable[tuple[str, torch.Tensor]]) -> Iterable[tuple[str, torch.Tensor]]:
    """vLLM's (name, tensor) stream of the folder's shards, a damaged or truncated shard reported as ours."""
    from safetensors import SafetensorError

    try:
        yield from weights
    except SafetensorError as err:
        first = str(err).strip().splitlines()[0][:200] if str(err).strip() else "unreadable"
        raise ValueError(f"WIDE: a safetensors file of the folder is truncated or damaged ({first}) (hint: copy the "
                         f"folder again, or {HINT}; `wide-export vllm --check DIR` names the file)") from None


class WideForCausalLM(nn.Module, SupportsLoRA, SupportsPP):
    """Registered as Wide{Llama,Mistral,Qwen2,Qwen3}ForCausalLM (model/arch.py's table); the family's
    differences (biases, q/k norm) come from config.json through WideConfig."""

    packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
    embedding_modules = {"embed_tokens": "input_embeddings", "lm_head": "output_embeddings"}

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__()
        hf = vllm_config.model_config.hf_config
        self.config = hf
        self.model = WideModel(vllm_config=vllm_config, prefix=maybe_prefix(prefix, "model"))
        cfg = self.model.wide
        if get_pp_group().is_last_rank:
            self.lm_head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size, quant_config=vllm_config.quant_config,
                                          prefix=maybe_prefix(prefix, "lm_head"))
            if cfg.tie_word_embeddings:
                self.lm_head = self.lm_head.tie_weights(self.model.embed_tokens)
            self.logits_processor = LogitsProcessor(cfg.vocab_size)
        else:
            self.lm_head = PPMissingLayer()
        self.make_empty_intermediate_tensors = self.model.make_empty_intermediate_tensors

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_input_ids(input_ids)

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor,
                intermediate_tensors: IntermediateTensors | None = None,
                inputs_embeds: torch.Tensor | None = None) -> torch.Tensor | IntermediateTensors:
        return self.model(input_ids, positions, intermediate_tensors, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        return self.logits_processor(self.lm_head, hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = dict(self.named_parameters())
        tied = self.model.wide.tie_word_embeddings
        loaded: set[str] = set()
        for name, tensor in _readable(weights):
            if "rotary_emb.inv_freq" in name or (tied and name == "lm_head.weight"):
                continue
            target, shard = name, None
            for fused, part, shard_id in STACKED:
                if part in name:
                    target, shard = name.replace(part, fused), shard_id
                    break
            if is_pp_missing_parameter(target, self):
                continue
            if target not in params:
                raise ValueError(f"WIDE: the folder holds {name}, which this model does not have "
                                 f"(hint: config.json does not describe these weights; {HINT})")
            param = params[target]
            loader = getattr(param, "weight_loader", default_weight_loader)
            if shard is None:
                loader(param, tensor)
            else:
                loader(param, tensor, shard)
            loaded.add(target)
        missing = sorted(n for n in params if ".router_" in n and n not in loaded
                         and not is_pp_missing_parameter(n, self))
        if missing:
            raise ValueError(f"WIDE: the folder lacks {len(missing)} router tensors its config.json describes, "
                             f"e.g. {missing[0]} (hint: {HINT})")
        for layer in islice(self.model.layers, self.model.start_layer, self.model.end_layer):
            layer.self_attn.after_load()
            layer.mlp.after_load()
        return loaded
