"""Machine-readable twin of docs/opset.md: the `wide` op set, version 1."""

from __future__ import annotations

from dataclasses import dataclass

DOMAIN = "wide"
OPSET_VERSION = 1
PLUGIN_VERSION = "1"
PLUGIN_NAMESPACE = ""


@dataclass(frozen=True)
class OpSpec:
    """One custom op: its inputs, outputs and int attributes (= plugin fields); `plugin`: whether the TensorRT
    plugin library has a creator for it (an op without one is built from its standard-op function body);
    `optional`: emitted only on request (an export flag), its function body attached only where it is used."""

    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    int_attrs: tuple[str, ...]
    plugin: bool = True
    optional: bool = False


OPS: dict[str, OpSpec] = {
    op.name: op
    for op in (
        OpSpec(
            "WideRouter",
            ("hidden", "compressor_weight", "compressor_bias", "router_weight", "router_bias"),
            ("mask",),
            ("num_groups",),
        ),
        OpSpec("WideMaskedGemmN", ("x", "weight", "mask", "bias"), ("y",), ("group_size", "has_bias")),
        OpSpec("WideMaskedGatedMlp", ("x", "gate_weight", "up_weight", "mask"), ("y",), ("group_size",)),
        OpSpec("WideMaskedGemmK", ("x", "weight", "mask", "bias"), ("y",), ("group_size", "has_bias")),
        # emitted only by `wide-export onnx --attention-op`
        OpSpec("WideMaskedAttention", ("q", "k", "v", "allowed", "head_mask"), ("y",), ("group_heads",),
               optional=True),
    )
}


def plugin_attrs(**ints: int) -> dict[str, object]:
    """Node attributes for a `wide` op: the int fields plus plugin version/namespace."""
    return {**{k: int(v) for k, v in ints.items()}, "plugin_version": PLUGIN_VERSION,
            "plugin_namespace": PLUGIN_NAMESPACE}
