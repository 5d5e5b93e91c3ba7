"""Run an exported graph in ONNX Runtime one layer slice at a time, so only one slice's weights are loaded.

The graph's nodes are in topological order, and node names follow the module
tree (`/model/layers.{i}/...`, export/postprocess.py). The order is cut into
contiguous slices: everything before layer 0's first node (the embedding, the
rotary tables, the attention mask), then one slice from each layer's first node
to the next layer's, then the head (final norm, lm_head). Any cut of a
topological order into contiguous pieces is a pipeline: a slice reads graph
inputs and values that earlier slices computed, and hands on the values later
slices or the caller need. Running the slices in order therefore runs the
nodes of the whole graph on the same inputs, while each ONNX Runtime session
holds only the initializers its own nodes use, read from the export's external
data file when it is created. For float32 graphs with graph optimizations off
the outputs are bit-identical to the whole graph's (tested). Otherwise
ONNX Runtime's rewrites may differ across a cut: fusions, and on CPU the casts
it inserts to run float16 nodes in float32 (`InsertedPrecisionFreeCast`), which
inside one session can skip a float16 rounding that a cut makes (seen: up to
2e-3 on float16 logits, no router decision changed).

Slices run slice-major: slice c runs every step (prefill, then decodes) before
slice c+1 is loaded, so each slice's weights are read once. A step's
`past_key_values.{j}` is the graph's own `present.{j}` of the step before. An
earlier slice may read a later layer's past (the exporter computes the past
length from the Shape of some layer's past input in the prologue); that
present does not exist yet, so the reference's present of the same shape is
fed there, and `SlicedRun.borrowed` lists every such input with whether a
non-Shape node reads it (which would make the run differ from the whole graph's).

Given the reference's residual stream per layer, each layer slice and the head
also run on the reference's inputs (`SlicedRun.per_layer`), which checks every
layer on its own (see run_sliced).
"""

from __future__ import annotations

import gc
import re
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from wide_export.base.signals import check_interrupted

_LAYER = re.compile(r"^/model/layers\.(\d+)/")
_PAST = re.compile(r"^past_key_values\.(\d+)\.(key|value)$")


@dataclass
class Slice:
    """A contiguous run of graph nodes and what crosses its borders."""

    name: str  # "prologue", "layer 3", "head"
    nodes: list  # onnx.NodeProto, graph order
    inputs: list[str]  # graph inputs and earlier slices' values it reads
    outputs: list[str]  # its values that later slices or the graph's outputs need
    initializers: list  # onnx.TensorProto (external data not loaded)
    weight_bytes: int = 0


@dataclass
class SlicedRun:
    """Per-step graph outputs of a sliced run, and what the run did."""

    outputs: list[dict[str, np.ndarray]]
    slices: list[tuple[str, int, int]]  # (name, nodes, weight bytes)
    borrowed: dict[str, bool] = field(default_factory=dict)  # past input fed from the reference -> read as data?
    per_layer: list[dict[str, np.ndarray]] | None = None  # outputs of the reference-fed runs (run_sliced)

    def describe(self) -> str:
        name, _, size = max(self.slices, key=lambda s: s[2])
        text = (f"ONNX Runtime ran the graph in {len(self.slices)} slices (prologue, one per layer, head), "
                f"one session at a time; the largest held {size / 2**20:.1f} MiB of weights ({name})")
        if self.borrowed:
            shape_only = all(not data for data in self.borrowed.values())
            text += (f"; {len(self.borrowed)} later-layer past inputs read by earlier slices were fed the "
                     f"reference's present of the same shape" + (" (read only for their Shape)" if shape_only
                                                                 else " (READ AS DATA: not the whole graph's run)"))
        return text


def _tensor_bytes(t) -> int:
    import onnx

    count = int(np.prod(list(t.dims), dtype=np.int64)) if len(t.dims) else 1
    return count * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize


def plan_slices(graph) -> list[Slice]:
    """Cut `graph` (an onnx.GraphProto) at each layer's first node and after the last layer's last node."""
    starts: dict[int, int] = {}
    last_layer_node = -1
    for k, node in enumerate(graph.node):
        m = _LAYER.match(node.name)
        if m:
            starts.setdefault(int(m.group(1)), k)
            last_layer_node = k
    if not starts:
        raise ValueError("no /model/layers.N/ nodes: not a graph written by wide-export")
    cuts = sorted(set(starts.values()))
    if cuts != [starts[i] for i in sorted(starts)]:
        raise ValueError("layers do not start in layer order")
    bounds = [0, *cuts, last_layer_node + 1, len(graph.node)]
    names = ["prologue", *(f"layer {i}" for i in sorted(starts)), "head"]
    pieces = [list(graph.node[a:b]) for a, b in zip(bounds, bounds[1:])]
    inits = {t.name: t for t in graph.initializer}
    graph_outputs = [o.name for o in graph.output]
    produced_by: dict[str, int] = {}
    for c, nodes in enumerate(pieces):
        for node in nodes:
            for out in node.output:
                if out:
                    produced_by[out] = c
    graph_inputs = {i.name for i in graph.input}
    needs: list[list[str]] = []  # per slice: the values it reads that it does not make itself
    for c, nodes in enumerate(pieces):
        own = {o for n in nodes for o in n.output if o}
        seen: dict[str, None] = {}
        for node in nodes:
            for name in _reads(node):
                if name and name not in own and name not in inits and name not in seen:
                    if name not in graph_inputs and produced_by.get(name, c) >= c:
                        raise ValueError(f"{names[c]} reads {name} before it is computed")
                    seen[name] = None
        needs.append(list(seen))
    slices = []
    for c, nodes in enumerate(pieces):
        later = {n for reads in needs[c + 1:] for n in reads}
        outputs = [o for n in nodes for o in n.output if o and (o in later or o in graph_outputs)]
        used = {name for n in nodes for name in _reads(n) if name in inits}
        tensors = [inits[n] for n in inits if n in used]
        slices.append(Slice(names[c], nodes, needs[c], outputs, tensors, sum(_tensor_bytes(t) for t in tensors)))
    return [s for s in slices if s.nodes]


def _reads(node):
    """Names a node reads, including those its subgraphs (If/Loop/Scan bodies) take from the outer scope."""
    yield from node.input
    for attr in node.attribute:
        for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
            inner = {o for n in sub.node for o in n.output} | {i.name for i in sub.input} | \
                    {t.name for t in sub.initializer}
            for n in sub.node:
                yield from (name for name in _reads(n) if name not in inner)


def slice_model(model, piece: Slice, types: dict[str, int]):
    """A standalone onnx.ModelProto of `piece`: its nodes, its initializers (still external), all functions."""
    import onnx
    from onnx import helper

    graph = helper.make_graph(
        piece.nodes, piece.name.replace(" ", "_"),
        [helper.make_tensor_value_info(name, types[name], None) for name in piece.inputs],
        [onnx.ValueInfoProto(name=name) for name in piece.outputs],  # ONNX Runtime infers their types
        initializer=piece.initializers)
    return helper.make_model(graph, opset_imports=list(model.opset_import), functions=list(model.functions),
                             ir_version=model.ir_version)


def run_sliced(model, session_for: Callable, feeds: list[dict[str, np.ndarray]],
               reference_presents: list[dict[str, np.ndarray]],
               reference_hidden: list[list[np.ndarray]] | None = None,
               progress: Callable[[str], None] | None = None) -> SlicedRun:
    """Run `model` (an onnx.ModelProto without its weights loaded) over the steps in `feeds`, slice by slice.

    `feeds[k]` holds step k's graph inputs; the past of step 0 is in feeds[0], later pasts are the
    graph's own presents. `session_for(model_proto)` makes an ONNX Runtime session (it knows where the
    external data lives). `reference_presents[k]` holds the reference's `present.*` after step k.

    With `reference_hidden` (per step: the reference's residual stream entering each layer, then the
    head), every layer slice and the head also run a second time per step on the reference's inputs:
    that residual stream and, in decode steps, the reference's past. Those outputs (`SlicedRun.per_layer`)
    measure each layer on its own; the chained ones (`outputs`) are what the whole graph computes, where
    one near-tie router flip changes a token's state for every later layer.
    """
    from onnx import helper

    say = progress or (lambda _msg: None)
    graph = model.graph
    declared = {i.name: i.type.tensor_type.elem_type for i in graph.input}
    stores = [dict(f) for f in feeds]  # chained: the graph's own values
    forced: list[dict[str, np.ndarray]] = [{} for _ in feeds]  # per layer: outputs of reference-fed runs
    from_layers: set[str] = set()  # values that layer slices made
    layer_outputs: list[dict[str, np.ndarray]] = [{} for _ in feeds]  # residual stream each layer gave
    run = SlicedRun(outputs=[], slices=[])
    pieces = plan_slices(graph)
    for c, piece in enumerate(pieces):
        say(f"slice {c + 1}/{len(pieces)}: {piece.name} ({piece.weight_bytes / 2**20:.0f} MiB of weights)")
        missing = [name for name in piece.inputs if name not in stores[0]]
        if missing:
            raise ValueError(f"{piece.name} reads {missing[0]}, which no feed or earlier slice provides")
        types = {name: declared.get(name) or helper.np_dtype_to_tensor_dtype(np.asarray(stores[0][name]).dtype)
                 for name in piece.inputs}
        session = session_for(slice_model(model, piece, types))
        boundary = _boundary(piece, len(pieces))
        for k, store in enumerate(stores):
            # a past missing from the store: this slice's previous step may have just made it; if not,
            # the reference's stands in for this slice only (the store keeps the graph's own values)
            feed = {name: store[name] if name in store else _past(name, k, stores, reference_presents, piece, run)
                    for name in piece.inputs}
            store.update(zip(piece.outputs, session.run(piece.outputs, feed)))
            if reference_hidden is not None and boundary is not None:
                own = {name: forced[k].get(name, value) for name, value in feed.items()}
                stream, replaced = _reference_inputs(piece, feed, from_layers, reference_hidden[k][boundary],
                                                     reference_presents[k - 1] if k else None)
                if stream is not None:  # what the previous layer gave on the reference's inputs
                    layer_outputs[k][f"layer_output.{boundary - 1}"] = forced[k][stream]
                own.update(replaced)
                forced[k].update(zip(piece.outputs, session.run(piece.outputs, own)))
        if boundary is not None:
            from_layers.update(piece.outputs)
        del session
        gc.collect()
        check_interrupted()  # a Ctrl-C swallowed in a finalizer (ONNX Runtime, torch) stops here, not at the end
        run.slices.append((piece.name, len(piece.nodes), piece.weight_bytes))
    names = [o.name for o in graph.output]
    run.outputs = [{name: store[name] for name in names} for store in stores]
    if reference_hidden is not None:
        run.per_layer = [{**{name: f.get(name, s[name]) for name in names}, **extra}
                         for f, s, extra in zip(forced, stores, layer_outputs)]
    return run


def _boundary(piece: Slice, count: int) -> int | None:
    """Index of the reference residual stream a slice starts from: layer i -> i, the head -> layers."""
    if piece.name.startswith("layer "):
        return int(piece.name.split()[1])
    return count - 2 if piece.name == "head" else None


def _reference_inputs(piece: Slice, feed: dict, from_layers: set[str], hidden: np.ndarray,
                      previous_presents: dict | None) -> tuple[str | None, dict]:
    """The residual stream's name and the inputs a reference-fed run replaces: that stream, which an
    earlier layer made (the one input of the reference state's shape; the prologue's embedding output is
    kept, so it is checked too), and the past of decode steps."""
    out = {}
    from wide_export.verify.evaluator import is_float  # bfloat16 (ml_dtypes) is not np.floating

    stream = [name for name in piece.inputs if name in from_layers
              and np.asarray(feed[name]).shape == hidden.shape and is_float(np.asarray(feed[name]).dtype)]
    if len(stream) != (piece.name != "layer 0"):
        raise ValueError(f"{piece.name}: cannot tell the residual stream from the previous layer "
                         f"(candidates: {stream})")
    for name in stream:
        out[name] = hidden.astype(np.asarray(feed[name]).dtype)
    if previous_presents is not None:
        for name in piece.inputs:
            m = _PAST.match(name)
            if m:
                out[name] = previous_presents[f"present.{m.group(1)}.{m.group(2)}"].astype(
                    np.asarray(feed[name]).dtype)
    return (stream[0] if stream else None), out


def _past(name: str, step: int, stores, reference_presents, piece: Slice, run: SlicedRun) -> np.ndarray:
    """Step `step`'s value of the past input `name`: the graph's own previous present, else the reference's."""
    m = _PAST.match(name)
    if m is None:
        raise ValueError(f"{piece.name} reads {name}, which no feed or earlier slice provides")
    present = f"present.{m.group(1)}.{m.group(2)}"
    if present in stores[step - 1]:
        return stores[step - 1][present]
    dtype = np.asarray(stores[0][name]).dtype  # step 0's (empty) past has the graph's KV dtype
    run.borrowed[name] = run.borrowed.get(name, False) or any(
        n.op_type != "Shape" for n in piece.nodes if name in n.input)
    return reference_presents[step - 1][present].astype(dtype)
