"""Documented tolerances per dtype (README "Verification" repeats this table).

Outputs are compared with Polygraphy's SimpleCompareFunc: an element passes
when |a-b| <= atol or |a-b|/|b| <= rtol; `stat` says which error statistic is
checked (elemwise = every element). Router decisions are discontinuous, so
they get their own criteria: per-layer agreement >= min_agreement, and no flip
whose reference margin |l0 - l1| exceeds flip_margin (a flip of a near-tie is
precision, a flip of a clear decision is a bug).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float
    stat: str  # Polygraphy check_error_stat: elemwise | max | mean | median
    min_agreement: float
    flip_margin: float

    def to_dict(self) -> dict:
        return asdict(self)


TOLERANCES = {
    # ONNX Runtime fp32 vs PyTorch fp32: same math, different summation order.
    "float32": Tolerance(atol=1e-4, rtol=1e-3, stat="elemwise", min_agreement=0.99, flip_margin=1e-3),
    # fp16 graph vs the fp32 reference: fp16 rounding of activations and KV cache,
    # and the token-local effect of near-tie router flips -> mean-error check.
    "float16": Tolerance(atol=3e-2, rtol=3e-2, stat="mean", min_agreement=0.95, flip_margin=0.1),
    # bf16 graph (run as written by onnx's reference evaluator) vs the fp32 reference: bf16 keeps 8
    # significant bits (fp16: 11), so 8x fp16's rounding; same mean-error check and decision criteria.
    "bfloat16": Tolerance(atol=1e-1, rtol=1e-1, stat="mean", min_agreement=0.9, flip_margin=0.25),
}


def tolerance_for(dtype: str) -> Tolerance:
    return TOLERANCES[dtype]
