"""Trace two decoder layers, not all of them: the graph of layers 2..N-1 is copied from layer 1's.

Tracing costs ~2 s per layer on this 2-core machine (torch.export and its
decompositions work op by op with symbolic shapes; measured at Llama-3.2-1B width,
placeholder weights, trace / optimizer: 1 layer 4.4 / 0.2 s, 2: 4.6 / 0.3 s,
4: 8.8 / 0.6 s, 8: 15.4 / 1.5 s, 16: 32.8 / 5.1 s), so a 32-layer model spent
over a minute tracing the same layer 32 times. With the copy, the trace stage of
the 16-layer export is ~12-14 s, most of it the optimizer over the whole graph. When every layer has the same routing,
their graphs differ only in names: `model.layers.{i}.*` initializers,
`past_key_values.{i}.*` inputs, `present.{i}.*` outputs and the module scope the
node names are made from. So the model is traced with two layers (the first may
own the constants later layers share; the second is a clean template), before the
optimizer runs; layer 1's nodes are cloned for every further layer, chained on the
residual stream, and the optimizer then runs on the whole graph, as it does after
a full trace. tests/export/test_streaming_export.py compares the result with a
full trace node by node. One difference remains, by design: a full trace reads
each layer's past length off that layer's own `past_key_values.{i}` input
(Shape/Squeeze/Add nodes per layer), the copies read layer 1's; all layers'
past lengths are equal in any valid call, and the optimizer then shares the
shape computations (fewer Concat/Reshape nodes). Everything else -- `wide` nodes,
node names, initializers, functions, graph I/O -- is the full trace's.
"""

from __future__ import annotations

import ast
import dataclasses
import re

TRACED_LAYERS = 2
SCOPES = "pkg.torch.onnx.name_scopes"


def can_replicate(cfg) -> bool:
    """Layers are interchangeable: same routing everywhere, and more of them than we trace."""
    if cfg.num_layers <= TRACED_LAYERS:
        return False
    first = cfg.routing[0]
    return all(r == first for r in cfg.routing) and all(
        cfg.attn_group_size(i) == cfg.attn_group_size(0) and cfg.ffn_group_size(i) == cfg.ffn_group_size(0)
        for i in range(cfg.num_layers))


def short_config(cfg):
    """The same model with TRACED_LAYERS layers."""
    return dataclasses.replace(cfg, num_layers=TRACED_LAYERS, routing=list(cfg.routing[:TRACED_LAYERS]))


class ReplicationError(RuntimeError):
    """The traced graph does not have the shape replication relies on (a bug, or a new architecture)."""


def layer_of(node) -> int | None:
    try:
        scopes = ast.literal_eval(node.metadata_props.get(SCOPES, "[]"))
    except (ValueError, SyntaxError):
        return None
    for scope in scopes:
        m = re.fullmatch(r"model\.layers\.(\d+)", scope)
        if m:
            return int(m.group(1))
    return None


def _is_constant(node) -> bool:
    return node.op_type == "Constant" and node.domain == "" and not node.inputs


def replicate_layers(ir_model, num_layers: int) -> None:
    """Grow a graph traced with TRACED_LAYERS layers to `num_layers` (in place, before optimizing)."""
    import onnx_ir as ir

    g = ir_model.graph
    last = TRACED_LAYERS - 1
    block = [n for n in g if layer_of(n) == last]
    members = set(block)
    order = {n: k for k, n in enumerate(g)}
    at = [order[n] for n in block]
    if not at or at != list(range(at[0], at[0] + len(at))):
        raise ReplicationError(f"layer {last}'s nodes are not one contiguous run")
    h_in = {v for n in block for v in n.inputs if v is not None and v.producer() is not None
            and v.producer() not in members and layer_of(v.producer()) == last - 1
            and not _is_constant(v.producer())}
    h_out = {o for n in block for o in n.outputs for user, _ in o.uses() if user not in members} - set(g.outputs)
    if len(h_in) != 1 or len(h_out) != 1:
        raise ReplicationError(f"layer {last} should take and give one residual stream, got "
                               f"{len(h_in)} in and {len(h_out)} out")
    (h_in,), (h_out,) = h_in, h_out
    epilogue = [(user, idx) for user, idx in h_out.uses() if user not in members]
    inputs = {v.name: v for v in g.inputs}
    outputs = {v.name: v for v in g.outputs}
    old_prefix = f"model.layers.{last}."
    scope = re.compile(rf"model\.layers\.{last}(?!\d)")
    anchor, prev = block[-1], h_out
    for i in range(TRACED_LAYERS, num_layers):
        mapping = {h_in: prev}
        for kind in ("key", "value"):
            old = inputs[f"past_key_values.{last}.{kind}"]
            new = ir.Value(name=f"past_key_values.{i}.{kind}", shape=old.shape, type=old.type)
            g.inputs.append(new)
            mapping[old] = new
        clones = []
        for node in block:
            if _is_constant(node):
                continue  # shared, as the exporter shares constants between layers
            args = []
            for v in node.inputs:
                if v is not None and v not in mapping and v.is_initializer() and v.name.startswith(old_prefix):
                    mapping[v] = _initializer_copy(g, v, f"model.layers.{i}." + v.name[len(old_prefix):])
                args.append(mapping.get(v, v) if v is not None else None)
            clone = ir.Node(node.domain, node.op_type, args, attributes=list(node.attributes.values()),
                            overload=node.overload, num_outputs=len(node.outputs), version=node.version,
                            name=f"{node.name}__{i}",
                            metadata_props={k: scope.sub(f"model.layers.{i}", v)
                                            for k, v in node.metadata_props.items()})
            for old, new in zip(node.outputs, clone.outputs):
                new.name, new.shape, new.type = f"{old.name}__{i}", old.shape, old.type
                mapping[old] = new
            clones.append(clone)
        g.insert_after(anchor, clones)
        anchor, prev = clones[-1], mapping[h_out]
        for kind in ("key", "value"):
            new = mapping[outputs[f"present.{last}.{kind}"]]
            new.name = f"present.{i}.{kind}"
            g.outputs.append(new)
    for user, idx in epilogue:
        user.replace_input_with(idx, prev)


def _initializer_copy(g, value, name: str):
    import onnx_ir as ir

    new = ir.Value(name=name, shape=value.shape, type=value.type, const_value=value.const_value)
    g.register_initializer(new)
    return new
