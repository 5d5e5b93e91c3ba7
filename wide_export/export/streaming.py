"""Streamed weights: the traced graph's initializers read from the checkpoint, one tensor at a time.

The model is traced with placeholder parameters (checkpoint/lazy.py) and without
the exporter's optimizer. Every initializer that is a parameter then becomes an
`onnx_ir.LazyTensor` that reads, casts and LoRA-merges its tensor from the
memory-mapped safetensors shard when it is written (not cached), and only then
does the optimizer run -- the same pass torch.onnx.export(optimize=True) runs,
so the small weights it folds (e.g. a transposed k_proj of a tiny model) are
folded from the real values and the graph is the one the eager export writes.
"""

from __future__ import annotations


def attach_weights(ir_model, weights) -> int:
    """Point every parameter initializer of `ir_model` at `weights` (lazy.WeightSource); return how many."""
    import onnx_ir as ir
    from onnx_ir.tensor_adapters import TorchTensor

    known = set(weights.names())
    done = 0
    for name, value in ir_model.graph.initializers.items():
        if name not in known:
            continue  # constants the tracer made (inv_freq, shapes, ...): real values already
        old = value.const_value
        value.const_value = ir.LazyTensor(_as_ir(weights, name, TorchTensor), dtype=old.dtype, shape=old.shape,
                                          name=name)
        done += 1
    return done


def _as_ir(weights, name: str, wrap):
    return lambda: wrap(weights.tensor(name), name=name)
