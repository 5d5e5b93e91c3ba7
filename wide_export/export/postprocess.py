"""Passes over the exported onnx-ir model: names, axis names, function bodies, metadata."""

from __future__ import annotations

import ast
import re
from collections import Counter
from typing import Any

from wide_export.ops.io_spec import axes_of, mask_output_name
from wide_export.ops.spec import DOMAIN, OPSET_VERSION

# (parent module, op_type) -> projection name used in node names
PROJECTION_NAMES = {
    ("self_attn", "WideMaskedGemmN"): "q_proj",
    ("self_attn", "WideMaskedGemmK"): "o_proj",
    ("mlp", "WideMaskedGatedMlp"): "gate_up_proj",
    ("mlp", "WideMaskedGemmK"): "down_proj",
}
_LAYER = re.compile(r"model\.layers\.(\d+)\.(router_attention|router_ffn)$")


def module_path(fqn: str) -> str:
    """'model.layers.0.mlp' -> '/model/layers.0/mlp' (onnxruntime-genai style)."""
    return "/" + re.sub(r"\.(?=\D)", "/", fqn) if fqn else ""


def _scope(node) -> str:
    raw = node.metadata_props.get("pkg.torch.onnx.name_scopes")
    if not raw:
        return ""
    try:
        scopes = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return ""
    return scopes[-2] if len(scopes) >= 2 else ""


def name_nodes(model) -> None:
    """Node names mirror the module tree (unique); `wide` outputs get stable tensor names."""
    used: Counter[str] = Counter()
    for node in model.graph:
        fqn = _scope(node)
        base = module_path(fqn)
        if node.domain == DOMAIN:
            proj = PROJECTION_NAMES.get((fqn.rsplit(".", 1)[-1], node.op_type))
            if proj:
                base = f"{base}/{proj}"
        name = f"{base}/{node.op_type}"
        used[name] += 1
        node.name = name if used[name] == 1 else f"{name}_{used[name] - 1}"
        if node.domain == DOMAIN:
            m = _LAYER.search(fqn)
            if m and node.op_type == "WideRouter":
                node.outputs[0].name = mask_output_name(int(m.group(1)), m.group(2).split("_", 1)[1])
            else:
                node.outputs[0].name = f"{node.name}/output_0"


def name_axes(model) -> None:
    """Graph I/O shapes: dynamic axes get their conventional names, static ones keep numbers."""
    import onnx_ir as ir

    for value in [*model.graph.inputs, *model.graph.outputs]:
        if value.shape is None:
            continue
        dims = [d if isinstance(d, int) else axis for d, axis in zip(value.shape, axes_of(value.name))]
        value.shape = ir.Shape(dims)


def attach_functions(model) -> None:
    """Add the standard-op body of every `wide` op (of an op only some exports emit, WideMaskedAttention, where the
    graph has one) and import the `wide` opset."""
    import onnx_ir as ir

    from wide_export.ops.functions import function_protos
    from wide_export.ops.spec import OPS

    used = {node.op_type for node in model.graph if node.domain == DOMAIN}
    for proto in function_protos(model.opset_imports[""]):
        if not OPS[proto.name].optional or proto.name in used:
            fn = ir.serde.deserialize_function(proto)
            model.functions[fn.identifier()] = fn
    model.opset_imports[DOMAIN] = OPSET_VERSION


def set_metadata(model, meta: dict[str, Any]) -> None:
    model.producer_name = "wide-export"
    for key, value in meta.items():
        model.metadata_props[f"wide_export.{key}"] = str(value)


def wide_nodes(model) -> list:
    return [n for n in model.graph if n.domain == DOMAIN]
