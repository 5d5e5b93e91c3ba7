"""Run a bfloat16 export on CPU as written: onnx's reference evaluator with ml_dtypes arrays.

ONNX Runtime's CPU provider has no bfloat16 kernels for MatMul, Add, Mul,
Sigmoid, ReduceMax, ... (NOT_IMPLEMENTED in 1.32), and letting it insert
float32 casts would not run the bf16 graph. `onnx.reference.ReferenceEvaluator`
executes every node (and the `wide` function bodies) in numpy, with
`ml_dtypes.bfloat16` tensors between nodes, so each bf16 rounding the graph
asks for happens. It is slow (pure numpy), which is why large models are
checked slice by slice (verify/slices.py), and each slice gets its own
evaluator holding only that slice's weights.

`EvaluatorSession` has the `run(output_names, feed)` of an ONNX Runtime
session (what slices.py calls); `EvaluatorRunner` the context manager and
`infer(feed)` of a Polygraphy runner (what compare.run_steps calls).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def bfloat16():
    """numpy's bfloat16 dtype (ml_dtypes, an onnx dependency)."""
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


def is_float(dtype) -> bool:
    """np.floating, or bfloat16 (which numpy does not count as floating)."""
    dtype = np.dtype(dtype)
    return np.issubdtype(dtype, np.floating) or dtype == bfloat16()


class EvaluatorSession:
    """A ReferenceEvaluator over `proto` (a ModelProto whose external data, if any, lies in `weights_dir`)."""

    def __init__(self, proto, weights_dir: Path | None = None):
        import onnx
        from onnx.external_data_helper import uses_external_data
        from onnx.reference import ReferenceEvaluator

        if weights_dir is not None and any(uses_external_data(t) for t in proto.graph.initializer):
            copy = onnx.ModelProto()
            copy.CopyFrom(proto)
            onnx.load_external_data_for_model(copy, str(weights_dir))
            proto = copy
        self.output_names = [o.name for o in proto.graph.output]
        self._evaluator = ReferenceEvaluator(proto)

    def run(self, names, feed: dict) -> list:
        outs = self._evaluator.run(list(names) if names else None, feed)
        return [np.asarray(o) for o in outs]


class EvaluatorRunner:
    """Polygraphy-runner-like face of an EvaluatorSession (compare.run_steps)."""

    name = "onnx-reference"

    def __init__(self, session: EvaluatorSession):
        self.session = session

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def infer(self, feed: dict) -> dict:
        return dict(zip(self.session.output_names, self.session.run(None, feed)))
