"""ONNX export of a WIDE model: one graph with KV cache and `wide` custom ops."""

from wide_export.ops.io_spec import input_names, output_names


def export_onnx(*args, **kwargs):
    """See wide_export.export.onnx_export.export_onnx (imported lazily: it pulls in torch)."""
    from wide_export.export.onnx_export import export_onnx as _export

    return _export(*args, **kwargs)


__all__ = ["export_onnx", "input_names", "output_names"]
