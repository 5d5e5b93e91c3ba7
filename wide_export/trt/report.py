"""Which `wide` ONNX nodes became TensorRT plugin layers and which were inlined.

onnx-tensorrt names a plugin layer after its ONNX node; when no creator is
registered for a `wide` op it imports the node's local function body instead
(standard layers, named after the body's nodes). So a `wide` node is a plugin
layer iff the network has a PLUGIN_V3 layer carrying the node's name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

WIDE_DOMAIN = "wide"


@dataclass(frozen=True)
class NodeOutcome:
    name: str
    op_type: str
    plugin_layer: bool


@dataclass(frozen=True)
class PluginReport:
    """Outcome of every `wide` node of the graph."""

    nodes: tuple[NodeOutcome, ...]

    @property
    def plugin(self) -> list[NodeOutcome]:
        return [n for n in self.nodes if n.plugin_layer]

    @property
    def inlined(self) -> list[NodeOutcome]:
        return [n for n in self.nodes if not n.plugin_layer]

    def by_op(self) -> dict[str, tuple[int, int]]:
        """op_type -> (plugin layers, inlined bodies)."""
        table: dict[str, tuple[int, int]] = {}
        for n in self.nodes:
            p, i = table.get(n.op_type, (0, 0))
            table[n.op_type] = (p + n.plugin_layer, i + (not n.plugin_layer))
        return table

    def to_dict(self) -> dict[str, Any]:
        return {
            "total": len(self.nodes),
            "plugin_layers": len(self.plugin),
            "inlined": len(self.inlined),
            "by_op": {k: {"plugin_layers": p, "inlined": i} for k, (p, i) in self.by_op().items()},
            "nodes": [{"name": n.name, "op_type": n.op_type,
                       "became": "plugin_layer" if n.plugin_layer else "inlined_function"} for n in self.nodes],
        }


def wide_nodes(graph) -> list[tuple[str, str]]:
    """(name, op_type) of the `wide`-domain nodes of an onnx GraphProto."""
    return [(n.name, n.op_type) for n in graph.node if n.domain == WIDE_DOMAIN]


def plugin_layer_names(network, trt) -> set[str]:
    """Names of the PLUGIN_V3 layers of a parsed INetworkDefinition."""
    kinds = {getattr(trt.LayerType, k) for k in ("PLUGIN_V3", "PLUGIN_V2", "PLUGIN") if hasattr(trt.LayerType, k)}
    return {network.get_layer(i).name for i in range(network.num_layers) if network.get_layer(i).type in kinds}


def plugin_report(nodes: Iterable[tuple[str, str]], layer_names: set[str]) -> PluginReport:
    """Classify each `wide` node by whether a plugin layer carries its name."""
    return PluginReport(tuple(NodeOutcome(name, op, name in layer_names) for name, op in nodes))
