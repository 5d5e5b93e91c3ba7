"""One rank's model: the WIDE decoder (model/modeling.py, the only one) with its heads / FFN channels only and a
RankShard on each layer: the rank's slices of the router masks, all-reduces after o_proj and down_proj
(row-parallel). Traced like the single-device model; the all-reduce becomes a `DistCollective` node.

Routers stay whole on every rank (replicated, a few MB): each rank computes the full [B, T, G] mask and
uses its own slice of it, so every rank takes the same decisions and no mask is communicated.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from wide_export.model.config import rank_groups
from wide_export.ops import dispatch

# The all-reduce as Polygraphy's `multi-device shard` writes collectives into ONNX
# (NVIDIA/TensorRT tools/Polygraphy/polygraphy/tools/multi_device/subtool/shard.py, 11.x: op_type
# `DistCollective` in the default domain, string attributes `collective_operation` / `reduce_op`, int `root`
# and `group_size`, ints `groups`), which TensorRT 11's ONNX parser turns into an IDistCollectiveLayer.
# 11.x's shard writes only all_gather / reduce_scatter; the all-reduce's values are those of Polygraphy
# 10.14's `DistCollective.all_reduce_attrs()` (multi_device/multi_device.py at NVIDIA/TensorRT 3b4ddc1d):
# collective_operation "all_reduce", reduce_op "sum" -- the lower-case names of CollectiveOperation::kALL_REDUCE
# and ReduceOperation::kSUM (include/NvInfer.h). 10.14 also wrote `nb_rank`, which 11.x's shard dropped.
TRACE_DOMAIN = "wide_tp"  # the tracer needs a domain; export.py moves the node to the default domain
COLLECTIVE = "DistCollective"


def all_reduce(x: torch.Tensor, tp: int) -> torch.Tensor:
    """Sum of `x` over the tp ranks. Eager: a world of one (identity); under export: a DistCollective node."""
    if dispatch.exporting():
        attrs = {"collective_operation": "all_reduce", "reduce_op": "sum", "root": -1, "group_size": tp}
        return torch.onnx.ops.symbolic(f"{TRACE_DOMAIN}::{COLLECTIVE}", [x], attrs=attrs, dtype=x.dtype,
                                       shape=x.shape, version=1)
    if tp != 1:
        raise RuntimeError("a rank model runs eagerly only in a world of one; run the rank graphs instead")
    return x


@dataclass
class RankShard:
    """One rank's hook on the decoder (modeling.DecoderLayer.shard): its slices of the router masks (the groups
    whose heads / FFN channels its projections hold) and the all-reduce after o_proj and down_proj."""

    tp: int
    attn_slice: tuple[int, int] | None  # [start, end) of the attention mask's groups; None: no attention router
    ffn_slice: tuple[int, int] | None

    def attention_mask(self, mask):
        return mask if mask is None or self.attn_slice is None else mask[..., self.attn_slice[0]:self.attn_slice[1]]

    def ffn_mask(self, mask):
        return mask if mask is None or self.ffn_slice is None else mask[..., self.ffn_slice[0]:self.ffn_slice[1]]

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return all_reduce(x, self.tp)


def to_rank_model(model, cfg, tp: int, rank: int):
    """Turn a WideForCausalLM built from plan.rank_config(cfg, tp) into rank `rank`'s model (in place).

    The router's FFN groups are in placement order (export.py permutes the router rows), so a rank's
    groups are always the contiguous slice [rank*Gf/tp, (rank+1)*Gf/tp) of the mask."""
    for i, layer in enumerate(model.model.layers):
        r = cfg.routing[i]
        # group sizes are the model's (heads / channels per group), not the rank config's
        layer.attn_group_heads = cfg.attn_group_size(i)
        layer.ffn_group_size = cfg.ffn_group_size(i)
        layer.shard = RankShard(tp, rank_groups(r.attn_groups, tp, rank), rank_groups(r.ffn_groups, tp, rank))
    return model
