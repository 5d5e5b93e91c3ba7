"""The Polygraphy comparison on the Polygraphy in use: no deprecated API, verdicts checked by hand."""

from __future__ import annotations

import warnings
from importlib.metadata import version

import numpy as np
import pytest

from wide_export.verify.compare import VerifyReport, compare, simple_compare_func
from wide_export.verify.reference import Step
from wide_export.verify.tolerances import TOLERANCES, Tolerance

TOL = Tolerance(atol=1e-3, rtol=1e-3, stat="elemwise", min_agreement=0.99, flip_margin=1e-3)


def _release(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".")[:2])


def test_installed_polygraphy_offers_the_successor_of_compare_func_simple():
    from polygraphy import comparator

    if _release(version("polygraphy")) >= (0, 53):  # simple() deprecated in 0.53, removed in 0.60
        assert isinstance(simple_compare_func(TOL), comparator.SimpleCompareFunc)
    if _release(version("polygraphy")) >= (0, 60):
        assert not hasattr(getattr(comparator, "CompareFunc", None), "simple")


def _case(shift: float) -> tuple[list[Step], list[dict[str, np.ndarray]]]:
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((2, 3, 5)).astype(np.float32)
    got = ref.copy()
    got[1, 2, 3] += shift  # one element off by `shift`
    return [Step(feed={}, ref={"logits": ref})], [{"logits": got}]


@pytest.mark.parametrize("shift, passes", [(0.0, True), (5e-4, True), (0.5, False)])
def test_compare_verdict_matches_a_hand_check_without_deprecation_warnings(shift, passes):
    steps, outs = _case(shift)
    ref, got = steps[0].ref["logits"], outs[0]["logits"]
    diff = np.abs(got - ref)
    by_hand = bool(np.all((diff <= TOL.atol) | (diff <= TOL.rtol * np.abs(ref))))
    assert by_hand == passes
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # a deprecated Polygraphy API would raise here
        report = compare(steps, outs, TOL, VerifyReport("t", "float32", TOL.to_dict(), {}), "onnxrt")
    (row,) = report.outputs
    assert row.passed is passes and report.passed is passes
    assert row.max_abs == pytest.approx(float(diff.max()), abs=1e-7)


def _routing_case(attention_flip_token: int | None) -> tuple[list[Step], list[dict[str, np.ndarray]]]:
    """One layer, B=1, T=3 tokens, 2 groups; the FFN router flips token 1, group 0, by a clear margin."""
    attn, ffn = "/model/layers.0/router_attention/mask", "/model/layers.0/router_ffn/mask"
    ref = {attn: np.ones((1, 3, 2), np.int32), ffn: np.ones((1, 3, 2), np.int32)}
    margins = {attn: np.full((1, 3, 2), 0.05, np.float32), ffn: np.full((1, 3, 2), 5.0, np.float32)}
    ref["logits"] = np.zeros((1, 3, 4), np.float32)
    got = {k: v.copy() for k, v in ref.items()}
    got[ffn][0, 1, 0] = 0
    if attention_flip_token is not None:
        got[attn][0, attention_flip_token, 1] = 0  # a near-tie (margin 0.05 < 0.1): precision
    return [Step(feed={}, ref=ref, margins=margins)], [got]


@pytest.mark.parametrize("token, explained", [(None, False), (1, True), (2, False)])
def test_ffn_flip_is_explained_only_by_an_attention_flip_of_the_same_token(token, explained):
    """A clear FFN flip counts as unexplained unless the same token's attention decision in the same layer
    flipped (by hand: 1 flip beyond the margin; the attention flip is a near-tie either way)."""
    tol = TOLERANCES["float16"]
    steps, outs = _routing_case(token)
    report = compare(steps, outs, tol, VerifyReport("t", "float16", tol.to_dict(), {}), "onnxrt")
    attn, ffn = report.decisions
    assert attn.unexplained_flips == 0 and attn.flips == (token is not None)
    assert (ffn.flips, ffn.unexplained_flips, ffn.caused_upstream) == (1, 0 if explained else 1, 1 if explained else 0)
