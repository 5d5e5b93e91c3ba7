"""`wide-export onnx`: trace a WIDE model into one ONNX graph (prefill + decode, KV cache).

The model is traced with torch.onnx.export(dynamo=True) computing with the reference method
(model/methods.py ReferenceMethod); routers and masked projections become `wide` nodes
(wide_export/ops/dispatch.py), which then get their function bodies, module-tree names and
conventional axis names.
"""

from __future__ import annotations

import contextlib

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wide_export import __version__
from wide_export.base.errors import WideError
from wide_export.export.genai_config import GENAI_CONFIG_NAME, check_genai_sources, write_genai_files
from wide_export.ops.io_spec import axes_of, input_names, mask_output_name, output_names
from wide_export.base.names import ONNX_DATA_FILE, ONNX_FILE, WIDE_CONFIG
from wide_export.ops.spec import DOMAIN, OPS, OPSET_VERSION

DTYPES = ("float32", "float16", "bfloat16")
DEFAULT_OPSET = 20
# Bytes of weights above which they go to model.onnx.data. Inline weights are serialized in memory all at
# once (several copies), so this bounds what an inline save adds to peak RSS (~4x at 1 GiB, measured).
EXTERNAL_DATA_THRESHOLD = 256 << 20
# File names: wide_export/base/names.py (the aliases keep this module's callers unchanged).
CONFIG_NAME, MODEL_NAME, DATA_NAME = WIDE_CONFIG, ONNX_FILE, ONNX_DATA_FILE


@dataclass
class ExportResult:
    output: Path
    config: dict[str, Any]
    wide_nodes: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)


def export_onnx(loaded, output: Path, *, opset: int = DEFAULT_OPSET, force: bool = False,
                stages=None, attention_op: bool = False) -> ExportResult:
    """Export `loaded` (checkpoint.LoadedModel, already in the target dtype) into the folder `output`.
    attention_op: each routed layer's attention as one WideMaskedAttention node (docs/opset.md)."""
    from wide_export.base.outdir import atomic_output_dir
    from wide_export.base.progress import Stages

    stages = stages or Stages(quiet=True)
    if opset < 18:
        raise WideError(f"--opset {opset} is too old", "use opset 18 or newer (the function bodies need it)")
    model = loaded.model
    streamed = loaded.weights is not None  # placeholders traced, weights read while saving (streaming.py)
    from wide_export.export.provenance import hash_in_background

    check_genai_sources(loaded)  # files copied at the end are checked first
    hashing = hash_in_background(loaded.sources)  # sources loaded with checksums=False: hashed meanwhile
    with atomic_output_dir(output, force) as tmp:
        with stages.stage("trace"):
            if streamed:
                program = _trace_streamed(loaded, opset, attention_op)
            else:
                program = trace_program(model, opset, attention_op=attention_op)
        with stages.stage("rewrite"):
            ir_model = program.model
            counts = _postprocess(ir_model, loaded)
        with stages.stage("save"):
            external = _save(ir_model, tmp, stages)
            _check(tmp / MODEL_NAME)
            if hashing is not None:
                hashing.result()
            config = wide_config(loaded, opset, external, counts)
            # onnxruntime_genai.Model(output) loads the folder as it is
            config["files"].update(genai_config=GENAI_CONFIG_NAME, tokenizer=write_genai_files(loaded, tmp, MODEL_NAME))
            (tmp / CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n")
    return ExportResult(Path(output), config, counts, dict(stages.times))


def example_inputs(model, batch: int = 2, new: int = 3, past: int = 4):
    """Trace-time inputs; sizes >= 2 so torch.export keeps every axis dynamic."""
    import torch

    c = model.config
    ids = torch.randint(0, c.vocab_size, (batch, new))
    mask = torch.ones(batch, past + new, dtype=torch.long)
    pos = torch.arange(past, past + new).expand(batch, new)
    kv = [
        tuple(torch.randn(batch, c.num_key_value_heads, past, c.head_dim, dtype=model.dtype) for _ in range(2))
        for _ in range(c.num_layers)
    ]
    return ids, mask, pos, kv


def _trace_streamed(loaded, opset: int, attention_op: bool = False):
    """Trace the placeholder model -- two layers of it when the layers are alike (replicate.py) -- then
    point the initializers at the checkpoint (streaming.py) and optimize, as optimize=True would."""
    from wide_export.checkpoint.lazy import placeholder_model
    from wide_export.export import replicate
    from wide_export.export.streaming import attach_weights

    model, cfg = loaded.model, loaded.config
    if replicate.can_replicate(cfg):
        short = placeholder_model(replicate.short_config(cfg), model.model.inv_freq, model.model.rope_scaling,
                                  model.dtype)
        program = trace_program(short, opset, optimize=False, attention_op=attention_op)
        replicate.replicate_layers(program.model, cfg.num_layers)
    else:
        program = trace_program(model, opset, optimize=False, attention_op=attention_op)
    attach_weights(program.model, loaded.weights)
    program.optimize()  # what optimize=True runs, now on the real (lazy) small weights
    return program


@contextlib.contextmanager
def _quiet_exporter():
    """Silence what the exporter prints about itself, not about our model: its registry's "torchvision is not
    installed. Skipping torchvision::nms" warnings (we export no torchvision op) and torch's own pytree
    deprecation (FutureWarning about LeafSpec, raised inside torch.export). Between our stage lines they
    read as problems of the user's export."""
    import logging
    import warnings

    registry = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = registry.level
    registry.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*treespec, LeafSpec.*", category=FutureWarning)
            yield
    finally:
        registry.setLevel(level)


def trace_program(model, opset: int, optimize: bool = True, attention_op: bool = False):
    """torch.onnx.export's program of `model` computing with the reference method (each masked projection and
    router one `wide` node; attention_op: each routed layer's attention one WideMaskedAttention node); the model's
    own method is given back afterwards."""
    import torch

    from wide_export.model.methods import ReferenceMethod

    n = model.config.num_layers
    dyn = torch.export.Dim.DYNAMIC
    shapes = {
        "input_ids": {0: dyn, 1: dyn},
        "attention_mask": {0: dyn, 1: dyn},
        "position_ids": {0: dyn, 1: dyn},
        "past_key_values": [({0: dyn, 2: dyn}, {0: dyn, 2: dyn}) for _ in range(n)],
    }
    before = model.method
    model.use_method(ReferenceMethod(attention_op=attention_op))
    with torch.no_grad(), _quiet_exporter():
        try:
            return torch.onnx.export(
                model, example_inputs(model), dynamo=True, dynamic_shapes=shapes, opset_version=opset,
                input_names=input_names(n), output_names=output_names(n), optimize=optimize, verbose=False,
                report=False,
            )
        except Exception as err:  # the exporter wraps everything; keep the traceback, it is a bug
            raise RuntimeError(f"torch.onnx.export failed: {str(err).splitlines()[0]}") from err
        finally:
            model.use_method(before)


def _postprocess(ir_model, loaded) -> dict[str, int]:
    from wide_export.export import postprocess as pp

    pp.name_nodes(ir_model)
    pp.name_axes(ir_model)
    pp.attach_functions(ir_model)
    pp.set_metadata(ir_model, {"version": __version__, "opset": f"{DOMAIN}:{OPSET_VERSION}",
                               "model": _model_name(loaded)})
    counts: dict[str, int] = {op: 0 for op, spec in OPS.items() if not spec.optional}  # optional ops where present
    for node in pp.wide_nodes(ir_model):
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


def _save(ir_model, tmp: Path, stages) -> bool:
    import onnx_ir as ir

    total = sum(v.const_value.nbytes for v in ir_model.graph.initializers.values() if v.const_value is not None)
    external = total > EXTERNAL_DATA_THRESHOLD
    done = [0]

    def callback(tensor, info) -> None:
        done[0] += 1
        stages.update(f"save: writing weights {done[0]}/{info.total}")

    if external:
        ir.save(ir_model, tmp / MODEL_NAME, external_data=DATA_NAME, callback=callback)
    else:
        ir.save(ir_model, tmp / MODEL_NAME)
    return external


def _check(path: Path) -> None:
    import onnx

    onnx.checker.check_model(str(path), full_check=False)


def _model_name(loaded) -> str:
    from wide_export.model.demo import DEMO_NAME

    if loaded.is_demo:
        return DEMO_NAME
    cfg_src = loaded.sources.get("config", {}).get("path")
    return Path(cfg_src).parent.name if cfg_src else "unknown"


def _io_entry(name: str, dtype: str, cfg) -> dict[str, Any]:
    static = {"num_key_value_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim, "vocab_size": cfg.vocab_size}
    return {"name": name, "dtype": dtype, "shape": [static.get(a, a) for a in axes_of(name)]}


def wide_config(loaded, opset: int, external: bool, counts: dict[str, int]) -> dict[str, Any]:
    """Everything downstream (engines, Triton, verification) needs to know about the export."""
    cfg = loaded.config
    dtype = str(loaded.model.dtype).replace("torch.", "")  # float32, float16 or bfloat16
    n = cfg.num_layers
    layers = []
    for i in range(n):
        r = cfg.routing[i]
        layers.append({
            "attention": None if r.attn_groups is None else {
                "groups": r.attn_groups, "heads_per_group": cfg.attn_group_size(i),
                "group_size": cfg.attn_group_size(i) * cfg.head_dim, "rank": r.attn_rank,
                "mask": mask_output_name(i, "attention")},
            "ffn": None if r.ffn_groups is None else {
                "groups": r.ffn_groups, "group_size": cfg.ffn_group_size(i), "rank": r.ffn_rank,
                "mask": mask_output_name(i, "ffn")},
        })
    io_dtype = {"input_ids": "int64", "attention_mask": "int64", "position_ids": "int64", "logits": "float32"}
    return {
        "format": "wide-export/onnx",
        "wide_export_version": __version__,
        "model_name": _model_name(loaded),
        "demo": loaded.is_demo,
        "architecture": cfg.model_type,
        "dtype": dtype,
        "onnx_opset": opset,
        "num_layers": n,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "max_position_embeddings": cfg.max_position_embeddings,
        "config": cfg.to_dict(),
        "layers": layers,
        "op_set": {"domain": DOMAIN, "version": OPSET_VERSION, "doc": "docs/opset.md",
                   "ops": {op: {"inputs": list(s.inputs), "outputs": list(s.outputs), "int_attrs": list(s.int_attrs),
                                "nodes": counts.get(op, 0)} for op, s in OPS.items()}},
        "io": {
            "inputs": [_io_entry(x, io_dtype.get(x, dtype), cfg) for x in input_names(n)],
            "outputs": [_io_entry(x, io_dtype.get(x, dtype), cfg) for x in output_names(n)],
        },
        "files": {"model": MODEL_NAME, "external_data": DATA_NAME if external else None},
        "sources": loaded.sources,
        "lora_pairs_merged": loaded.lora_pairs,
        "lora_scale": loaded.lora_scale,
    }


def read_wide_config(folder: Path, uses: dict[str, str] | None = None) -> dict[str, Any]:
    """Load OUT/wide_config.json with a clear error when the folder is not an export (naming what it is and
    where it goes when it is another of our folders; `uses`: the command's own way per kind, base/folders.py)."""
    folder = Path(folder)
    path = folder / CONFIG_NAME
    if not (folder / MODEL_NAME).is_file() or not path.is_file():
        from wide_export.base.folders import elsewhere

        raise WideError(f"{folder} is not a wide-export ONNX folder (no {MODEL_NAME} / {CONFIG_NAME})",
                        elsewhere(folder, "onnx", uses) or "create one with `wide-export onnx --output DIR`")
    from wide_export.base.paths import confined, read_json

    hint = "re-run `wide-export onnx`"
    confined(path, folder, "export description")
    config = read_json(path, hint=hint)
    files = config.get("files") if isinstance(config, dict) else None
    if not isinstance(files, dict) or not isinstance(files.get("model"), str) \
            or not isinstance(files.get("external_data") or "", str):
        raise WideError(f"{path} does not name the export's files (files.model, files.external_data)", hint)
    for key in ("model", "external_data"):
        if files.get(key):
            confined(folder / files[key], folder, f"{path.name} files.{key}:")
    return config
