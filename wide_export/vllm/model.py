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

Three methods compute the same thing (methods.py): `native` (any device, the mask multiplies the
activations over vLLM's own layers), `triton` (CUDA: our Triton kernels as torch custom ops) and `cpu`
(vLLM's CPU backend: wide_export.cpu's kernels as custom ops, o_proj / down_proj laid out as W^T by the
reference decoder's CPU method). One is chosen when the model is built:
`--additional-config '{"wide_kernels": "auto|native|triton|cpu"}'` or `WIDE_VLLM_KERNELS`; auto = triton
on CUDA, cpu on CPU. Each routed sublayer and router holds it and calls it; nothing checks a mode per call.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from itertools import islice

import torch
from torch import nn
from vllm.compilation.decorators import support_torch_compile
from vllm.config import VllmConfig
from vllm.distributed import get_pp_group, get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size
from vllm.logger import init_logger
from vllm.model_executor.layers.activation import SiluAndMul
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.rotary_embedding import get_rope
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from vllm.model_executor.model_loader.weight_utils import default_weight_loader
from vllm.model_executor.models.interfaces import SupportsLoRA, SupportsPP
from vllm.model_executor.models.utils import (PPMissingLayer, extract_layer_index, is_pp_missing_parameter,
                                              make_empty_intermediate_tensors_factory, make_layers, maybe_prefix)
from vllm.sequence import IntermediateTensors

from wide_export.base.errors import WideError
from wide_export.model.config import rank_groups
from wide_export.vllm.methods import METHODS, NATIVE
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

    def __init__(self, shapes: dict[str, tuple[int, ...]], prefix: str, method):
        super().__init__()
        rank, hidden = shapes["compressor.weight"]
        self.compressor = _Affine(rank, hidden, f"{prefix}.compressor")
        self.router = _Affine(shapes["router.weight"][0], rank, f"{prefix}.router")
        self.method = method.for_router(rank)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """The int32 mask [T, G] for the whole model (every rank takes its slice)."""
        return self.method.route(self, h)


class WideAttention(nn.Module):
    def __init__(self, hf, cfg, layer: int, cache_config, quant_config, prefix: str, method):
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
        self.method = method if heads is not None else NATIVE
        self.method.claim(self.qkv_proj, self.o_proj)

    def after_load(self) -> None:
        """The method's re-layout (cpu: o_proj's weight as W^T, k and v rows to vLLM's CPU GEMM)."""
        self.method.process_weights_after_loading(self.o_proj)
        self.method.process_weights_after_loading(self.qkv_proj)

    def _qk_norm(self, x: torch.Tensor, norm: RMSNorm) -> torch.Tensor:
        by_head = x.view(*x.shape[:-1], x.shape[-1] // self.head_dim, self.head_dim)
        return norm(by_head).view(x.shape)

    def forward(self, positions: torch.Tensor, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        q, k, v = self.method.qkv(self, x, mask)
        if self.q_norm is not None:
            q, k = self._qk_norm(q, self.q_norm), self._qk_norm(k, self.k_norm)
        q, k = self.rotary_emb(positions, q, k)
        return self.method.out(self, self.attn(q, k, v), mask)


class WideMLP(nn.Module):
    def __init__(self, cfg, layer: int, quant_config, prefix: str, method):
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(cfg.hidden_size, [cfg.intermediate_size] * 2, bias=False,
                                                       quant_config=quant_config, prefix=f"{prefix}.gate_up_proj")
        self.down_proj = RowParallelLinear(cfg.intermediate_size, cfg.hidden_size, bias=False,
                                           quant_config=quant_config, prefix=f"{prefix}.down_proj")
        self.act_fn = SiluAndMul()
        self.group_size = cfg.ffn_group_size(layer)
        self.method = method if self.group_size is not None else NATIVE
        self.method.claim(self.gate_up_proj, self.down_proj)

    def after_load(self) -> None:
        """The method's re-layout (cpu: down_proj's weight as W^T)."""
        self.method.process_weights_after_loading(self.down_proj)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        return self.method.mlp(self, x, mask)


class WideDecoderLayer(nn.Module):
    def __init__(self, vllm_config: VllmConfig, cfg, prefix: str, method):
        super().__init__()
        hf = vllm_config.model_config.hf_config
        quant_config = vllm_config.quant_config
        self.index = layer = extract_layer_index(prefix)
        self.self_attn = WideAttention(hf, cfg, layer, vllm_config.cache_config, quant_config,
                                       f"{prefix}.self_attn", method)
        self.mlp = WideMLP(cfg, layer, quant_config, f"{prefix}.mlp", method)
        self.input_layernorm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        r, tp, rank = cfg.routing[layer], get_tensor_model_parallel_world_size(), get_tensor_model_parallel_rank()
        self.router_attention = self.router_ffn = None
        self.attn_slice = self.ffn_slice = (0, 0)
        if r.attn_groups is not None:
            self.router_attention = WideRouter(router_shapes(cfg, layer, "attention"), f"{prefix}.router_attention",
                                               method)
            self.attn_slice = rank_groups(r.attn_groups, tp, rank)  # the groups of this rank's query heads
        if r.ffn_groups is not None:
            self.router_ffn = WideRouter(router_shapes(cfg, layer, "ffn"), f"{prefix}.router_ffn", method)
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
        method = METHODS[mode]()  # held by every routed sublayer and router (vllm/methods.py)
        self.start_layer, self.end_layer, self.layers = make_layers(
            cfg.num_layers, lambda prefix: WideDecoderLayer(vllm_config, cfg, prefix, method),
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
