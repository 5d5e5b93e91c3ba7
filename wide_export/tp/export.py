"""`wide-export onnx --tp N`: one ONNX graph per tensor-parallel rank plus OUT/tp_manifest.json.

Each rank's graph is traced from its own placeholder model (model.py: its heads, KV heads and FFN channels,
whole routers, an all-reduce after o_proj and down_proj) with the streamed export's machinery: two layers
traced and replicated when the layers are alike, initializers that read their slice of the checkpoint
tensor when written (one tensor in memory at a time), so a rank costs what a single-device export of a
model 1/N as wide costs, and ranks are written one after the other.

OUT/rank{r}/model.onnx      rank r's graph (DistCollective nodes: all-reduce, sum, group_size N)
OUT/rank{r}/wide_config.json  its description (dimensions of the rank, as for a single-device export)
OUT/tp_manifest.json        world size, what every rank holds, the FFN placement and predicted loads
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from wide_export.tp.model import COLLECTIVE, TRACE_DOMAIN
from wide_export.tp.plan import FORMAT, MANIFEST, TPPlan, attn_group_range, ffn_channels, head_range, kv_range, \
    rank_config, rank_dir


class ShardedWeights:
    """The WeightSource face (names(), tensor(name)) of one rank: each tensor read whole, then sliced."""

    def __init__(self, full, cfg, plan: TPPlan, rank: int):
        self.full, self.cfg, self.plan, self.rank = full, cfg, plan, rank

    def names(self) -> list[str]:
        return self.full.names()

    def tensor(self, name: str):
        import torch

        t = self.full.tensor(name)
        cfg, tp, r, d = self.cfg, self.plan.tp, self.rank, self.cfg.head_dim
        if not name.startswith("model.layers."):
            return t  # embeddings, final norm, lm_head: replicated
        layer = int(name.split(".")[2])
        sub = name.split(".", 3)[3]
        if sub.startswith("self_attn.q_proj."):
            a, b = head_range(cfg, tp, r)
            return t[a * d:b * d].contiguous()
        if sub.startswith(("self_attn.k_proj.", "self_attn.v_proj.")):
            a, b = kv_range(cfg, tp, r)
            return t[a * d:b * d].contiguous()
        if sub == "self_attn.o_proj.weight":
            a, b = head_range(cfg, tp, r)
            return t[:, a * d:b * d].contiguous()
        if sub == "self_attn.o_proj.bias":  # row-parallel: added once, by rank 0
            return t if r == 0 else torch.zeros_like(t)
        if sub in ("mlp.gate_proj.weight", "mlp.up_proj.weight"):
            return t[ffn_channels(cfg, self.plan, layer, r)].contiguous()
        if sub == "mlp.down_proj.weight":
            return t[:, ffn_channels(cfg, self.plan, layer, r)].contiguous()
        if sub in ("router_ffn.router.weight", "router_ffn.router.bias"):
            order = self.plan.ffn_order[layer]  # group j of the graph is the checkpoint's group order[j]
            rows = [2 * g + k for g in order for k in (0, 1)]
            return t[rows].contiguous()
        return t  # norms, q_norm/k_norm, routers' compressors and attention routers: replicated


class EagerWeights:
    """WeightSource face of an eagerly loaded model (the demo)."""

    def __init__(self, model):
        self.state = model.state_dict()

    def names(self) -> list[str]:
        return list(self.state)

    def tensor(self, name: str):
        return self.state[name]


def export_tp(loaded, output: Path, plan: TPPlan, *, opset: int = 20, force: bool = False, stages=None,
              balance: dict | None = None) -> dict[str, Any]:
    """Write the rank graphs of `loaded` (lazy or eager, any dtype) into `output`; returns the manifest."""
    from wide_export.base.errors import WideError
    from wide_export.base.outdir import atomic_output_dir
    from wide_export.base.progress import Stages

    stages = stages or Stages(quiet=True)
    if opset < 18:
        raise WideError(f"--opset {opset} is too old", "use opset 18 or newer (the function bodies need it)")
    cfg = loaded.config
    full = loaded.weights if loaded.weights is not None else EagerWeights(loaded.model)
    ranks = []
    with atomic_output_dir(output, force) as tmp:
        for r in range(plan.tp):
            with stages.stage(f"rank {r}/{plan.tp}"):
                ranks.append(_export_rank(loaded, full, plan, r, tmp / rank_dir(r), opset, stages))
        manifest = _manifest(loaded, plan, ranks, balance)
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def _export_rank(loaded, full, plan: TPPlan, rank: int, folder: Path, opset: int, stages) -> dict[str, Any]:
    from wide_export.export import onnx_export as ox
    from wide_export.export.streaming import attach_weights

    cfg = loaded.config
    folder.mkdir(parents=True)
    rcfg = rank_config(cfg, plan.tp)
    program = _trace_rank(loaded, cfg, rcfg, plan.tp, rank, opset)
    attach_weights(program.model, ShardedWeights(full, cfg, plan, rank))
    program.optimize()
    ir_model = program.model
    counts = ox._postprocess(ir_model, loaded)
    collectives = _finish_collectives(ir_model, plan.tp)
    external = ox._save(ir_model, folder, stages)
    rank_loaded = SimpleNamespace(config=rcfg, model=SimpleNamespace(dtype=loaded.model.dtype),
                                  is_demo=loaded.is_demo, sources=loaded.sources, lora_pairs=loaded.lora_pairs,
                                  lora_scale=loaded.lora_scale)
    config = ox.wide_config(rank_loaded, opset, external, counts)
    for i, layer in enumerate(config["layers"]):  # groups are the model's: sizes of a group, not of a rank
        if layer["attention"]:
            layer["attention"].update(heads_per_group=cfg.attn_group_size(i),
                                      group_size=cfg.attn_group_size(i) * cfg.head_dim,
                                      local_groups=list(range(*attn_group_range(cfg, i, plan.tp, rank))))
        if layer["ffn"]:
            k = cfg.routing[i].ffn_groups // plan.tp
            layer["ffn"].update(group_size=cfg.ffn_group_size(i), group_order=plan.ffn_order[i],
                                local_groups=list(range(rank * k, (rank + 1) * k)))
    config["format"] = FORMAT
    config["tp"] = {"world_size": plan.tp, "rank": rank, "collectives": collectives}
    (folder / ox.CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n")
    return {"rank": rank, "folder": rank_dir(rank), "model": f"{rank_dir(rank)}/{ox.MODEL_NAME}",
            "external_data": f"{rank_dir(rank)}/{ox.DATA_NAME}" if external else None,
            "bytes": sum(f.stat().st_size for f in folder.iterdir()), "collectives": len(collectives)}


def _trace_rank(loaded, cfg, rcfg, tp: int, rank: int, opset: int):
    from wide_export.checkpoint.lazy import placeholder_model
    from wide_export.export import replicate
    from wide_export.export.onnx_export import trace_program
    from wide_export.tp.model import to_rank_model

    base = loaded.model.model
    if replicate.can_replicate(cfg):
        short, rshort = replicate.short_config(cfg), replicate.short_config(rcfg)
        model = to_rank_model(placeholder_model(rshort, base.inv_freq, base.rope_scaling, loaded.model.dtype),
                              short, tp, rank)
        program = trace_program(model, opset, optimize=False)
        replicate.replicate_layers(program.model, cfg.num_layers)
    else:
        model = to_rank_model(placeholder_model(rcfg, base.inv_freq, base.rope_scaling, loaded.model.dtype),
                              cfg, tp, rank)
        program = trace_program(model, opset, optimize=False)
    return program


def _finish_collectives(ir_model, tp: int) -> list[dict[str, Any]]:
    """DistCollective nodes into the default domain, named after their sublayer, with Polygraphy's
    `groups` attribute ([]: all ranks); returns [{name, layer, sublayer}] in graph order."""
    import onnx_ir as ir

    from wide_export.export.replicate import layer_of

    out, seen = [], set()
    for node in ir_model.graph:
        if node.domain != TRACE_DOMAIN:
            continue
        layer = layer_of(node)
        sub = "mlp" if (layer, "self_attn") in seen else "self_attn"
        seen.add((layer, sub))
        node.domain = ""
        node.version = None
        node.name = f"/model/layers.{layer}/{sub}/all_reduce/{COLLECTIVE}"
        node.outputs[0].name = f"/model/layers.{layer}/{sub}/all_reduce/output_0"
        for key in ("plugin_version", "plugin_namespace"):
            node.attributes.pop(key, None)
        node.attributes["groups"] = ir.AttrInt64s("groups", [])
        out.append({"name": node.name, "layer": layer, "sublayer": sub, "input": node.inputs[0].name,
                    "output": node.outputs[0].name})
    ir_model.opset_imports.pop(TRACE_DOMAIN, None)
    if len(out) != 2 * len({c["layer"] for c in out}):
        raise RuntimeError(f"expected two all-reduces per layer, found {len(out)}")
    return out


def _manifest(loaded, plan: TPPlan, ranks: list[dict], balance: dict | None) -> dict[str, Any]:
    from wide_export import __version__
    from wide_export.export.onnx_export import _model_name

    cfg = loaded.config
    d = cfg.head_dim
    holds = []
    for r in range(plan.tp):
        layers = []
        for i in range(cfg.num_layers):
            a, b = head_range(cfg, plan.tp, r)
            ka, kb = kv_range(cfg, plan.tp, r)
            ag = attn_group_range(cfg, i, plan.tp, r)
            layers.append({"q_heads": [a, b], "kv_heads": [ka, kb], "attention_groups": list(ag) if ag else None,
                           "ffn_groups": plan.ffn_groups(i, r),
                           "q_proj_rows": [a * d, b * d], "o_proj_columns": [a * d, b * d],
                           "o_proj_bias": r == 0})
        holds.append({**ranks[r], "layers": layers})
    return {
        "format": FORMAT,
        "wide_export_version": __version__,
        "model_name": _model_name(loaded),
        "world_size": plan.tp,
        "dtype": str(loaded.model.dtype).replace("torch.", ""),
        "num_layers": cfg.num_layers,
        "collective": {"op_type": COLLECTIVE, "domain": "", "collective_operation": "all_reduce",
                       "reduce_op": "sum", "after": ["self_attn.o_proj", "mlp.down_proj"]},
        "replicated": ["model.embed_tokens", "router_attention", "router_ffn", "input_layernorm",
                       "post_attention_layernorm", "q_norm/k_norm", "model.norm", "lm_head"],
        "ffn_placement": {"kind": plan.placement, "group_order": plan.ffn_order,
                          "note": "graph group j is checkpoint group group_order[layer][j]; rank r holds graph "
                                  "groups [r*G/N, (r+1)*G/N); router rows, gate/up rows and down columns are "
                                  "permuted together"},
        "balance": balance,
        "ranks": holds,
        "sources": loaded.sources,
    }
