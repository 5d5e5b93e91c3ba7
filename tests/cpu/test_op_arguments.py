"""The CPU kernels (wide_cpu::*) refuse bad arguments with one error line before they touch memory, through the
public wrappers of cpu/ops.py too (a WideError there): each reproduction of issue 60 crashed the process (a group
count x group size that wraps, zero-sized dims, a short value cache) or returned wrong numbers (an `out` that is an
input). Each runs in a child process, so a crash is seen as the signal it is. And decode attention propagates a NaN
key or an infinite query as the reference's softmax does."""

from __future__ import annotations

import ast

import pytest
import torch

from tests.cpu.op_cases import Zygote, call_step, describe, outcome, step_args, step_reference
from wide_export.ops import reference as ref

cpu = pytest.importorskip("wide_export.cpu.ops")
pytestmark = pytest.mark.skipif(not cpu.available(), reason="no C++ compiler: the CPU kernels are not built")

HUGE_N, HUGE_K = 2**62 + 4, 2**62 + 16  # x 4 groups: 2**64 + 16 / + 64, which wrap to N = 16 / K = 64


@pytest.fixture(scope="module")
def child():
    """Runs each snippet in a process of its own (forked from one that loaded the kernels): a crash is a signal."""
    zygote = Zygote()
    yield zygote.run
    zygote.close()


def _refused(child, setup: str, call: str, match: str, kind: str) -> str:
    res = child(setup + outcome(call))
    assert res.returncode == 0, describe(res)
    line = res.stdout.strip().splitlines()[-1]
    assert line.startswith("REFUSED|"), describe(res)
    _, got, message = line.split("|", 2)
    assert got == kind, line
    assert match in message, line
    assert "\n" not in message.strip() and "Traceback" not in res.stderr, describe(res)
    return message


GEMM = """
x, mask = torch.randn(2, 64), torch.ones(2, 4, dtype=torch.int32)
w, wt = torch.randn(16, 64), torch.randn(64, 16)
"""


@pytest.mark.parametrize("call", [
    f"cpu.masked_gemm_n(x, w, mask, {HUGE_N}, path='masked')",
    f"cpu.masked_gated_mlp(x, w, w, mask, {HUGE_N}, path='masked')",
    f"cpu.masked_gemm_k(x, w, mask, {HUGE_K}, path='masked')",
    f"cpu.masked_gemm_kt(x, wt, mask, {HUGE_K}, path='masked')",
], ids=["gemm_n", "gated", "gemm_k", "gemm_kt"])
def test_a_group_size_whose_product_wraps_is_refused(child, call):
    """mask [2, 4] x group size 2**62 + c: the 64-bit product wraps to the real width; the check must not."""
    message = _refused(child, GEMM, call, "group", "WideError")
    assert "hint:" in message


def test_a_refusal_reaches_the_cli_as_one_error_line(child):
    """Through a command (cli/common.py user_errors): exit 2 and one line 'error: ... (hint: ...)', no traceback."""
    code = GEMM + f"""
import contextlib, io
import typer
from wide_export.cli.common import user_errors

@user_errors
def command():
    cpu.masked_gemm_n(x, w, mask, {HUGE_N}, path="masked")

err = io.StringIO()
with contextlib.redirect_stderr(err):
    try:
        command()
    except typer.Exit as exit:
        print("EXIT", exit.exit_code)
print("STDERR", repr(err.getvalue()))
"""
    res = child(code)
    assert res.returncode == 0, describe(res)
    assert "EXIT 2" in res.stdout, describe(res)
    stderr = ast.literal_eval(res.stdout.split("STDERR ", 1)[1].strip())  # the repr printed above
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "(hint: " in lines[0], stderr
    assert "wide_cpu::gemm_n" in lines[0] and "Traceback" not in stderr


def test_the_op_itself_refuses_a_wrapping_group_size_with_a_runtime_error(child):
    _refused(child, GEMM, f"torch.ops.wide_cpu.gemm_n(x, w, mask, {HUGE_N}, None, torch.empty(2, 16))", "group",
             "RuntimeError")


def _returns_reference(child, setup: str, check: str) -> None:
    res = child(setup + check + "\nprint('SAME')")
    assert res.returncode == 0 and res.stdout.strip().endswith("SAME"), describe(res)


def test_rms_norm_of_a_zero_width_row_is_an_empty_result_not_a_crash(child):
    _returns_reference(child, "x, w = torch.randn(2, 0), torch.randn(0)\n",
                       "got = cpu.rms_norm(x, w, 1e-6)\nassert got is not None and got.shape == (2, 0)")


def test_the_router_of_a_zero_width_hidden_state_matches_the_reference_not_a_crash(child):
    _returns_reference(
        child, "h, wc, bc = torch.randn(1, 0), torch.randn(3, 0), torch.randn(3)\n"
               "wr, br = torch.randn(4, 3), torch.randn(4)\n",
        "from wide_export.ops.reference import wide_router\n"
        "assert torch.equal(cpu.router(h, wc, bc, wr, br), wide_router(h, wc, bc, wr, br).to(torch.int32))")


def test_rope_of_zero_heads_changes_nothing_not_a_crash(child):
    _returns_reference(child, "x, c = torch.randn(1, 0, 4), torch.randn(1, 4)\n",
                       "assert torch.ops.wide_cpu.rope(x, c, c) in (True, False) and x.shape == (1, 0, 4)")
    _returns_reference(child, "q, k, c = torch.randn(1, 1, 0, 4), torch.randn(1, 1, 0, 4), torch.randn(1, 1, 1, 4)\n",
                       "cpu.rope_(q, k, c, c)")


def test_a_decode_step_of_zero_width_is_refused(child):
    setup = "a = op_cases.step_args()\na['h'] = torch.randn(1, 1, 0)\n"
    _refused(child, setup, "op_cases.call_step(a)", "h", "RuntimeError")


@pytest.mark.parametrize("what, setup, match", [
    ("missing", "del a['weights']['self_attn.v_proj.weight']", "layer 0 has no self_attn.v_proj.weight"),
    ("unknown", "a['weights']['self_attn.v_proj.weights'] = torch.ones(1)", "unknown weight 'self_attn.v_proj.weights'"),
    ("dtype", "a['weights']['mlp.up_proj.weight'] = a['weights']['mlp.up_proj.weight'].double()",
     "layer 0's mlp.up_proj.weight must be Float, got Double"),
    ("shape", "a['weights']['self_attn.q_proj.bias'] = a['weights']['self_attn.q_proj.bias'][:-1]",
     "layer 0's self_attn.q_proj.bias must be"),
    ("router", "a['weights']['router_ffn.compressor.weight'] = torch.ones(2, 16)",
     "layer 0's router_ffn.compressor.weight is given but its FFN is not routed"),
    ("norms", "a['weights']['self_attn.q_norm.weight'] = torch.ones(8)", "self_attn.k_norm.weight"),
    ("geometry", "del a['geometry']['kv_heads']", "geometry 'kv_heads' is missing"),
    ("extra geometry", "a['geometry']['rope_theta'] = 10000", "unknown geometry 'rope_theta'"),
])
def test_a_decode_layer_weight_is_checked_by_name(child, what, setup, match):
    """The step's weights are named (cpu/step.py: LAYER_WEIGHTS): one missing, unknown, of another dtype or shape,
    a router's for a sublayer that is not routed, q_norm without k_norm, a geometry int missing or unknown: one
    error line that names it."""
    message = _refused(child, "a = op_cases.step_args()\n" + setup + "\n", "op_cases.call_step(a)", match,
                       "RuntimeError")
    assert message.startswith("wide_cpu::"), message


def test_a_value_cache_shorter_than_the_key_cache_is_refused_not_written_past(child):
    """cache_k holds 2**20 positions, cache_v (the same strides) one: position 2**20 - 1 of cache_v is far past its
    end; the op wrote it there (and read 2**20 rows from it)."""
    cap = 2**20
    setup = (f"cv = torch.empty(8).as_strided((1, 1, 1, 8), (8 * {cap}, 8 * {cap}, 8, 1))\n"
             f"a = op_cases.step_args(cap={cap}, length={cap - 1}, cache_v=cv)\n")
    _refused(child, setup, "op_cases.call_step(a)", "cache", "RuntimeError")


def test_an_out_that_is_an_input_is_refused(child):
    """out = x ([2, 64], w [64, 64]): the kernel wrote outputs over activations it had still to read."""
    setup = "x, w, mask = torch.randn(2, 64), torch.randn(64, 64), torch.ones(2, 4, dtype=torch.int32)\n"
    _refused(child, setup, "cpu.masked_gemm_n(x, w, mask, 16, out=x, path='masked')", "overlap", "WideError")
    _refused(child, setup, "torch.ops.wide_cpu.gemm_n(x, w, mask, 16, None, x)", "overlap", "RuntimeError")


def test_a_valid_decode_step_of_the_helper_matches_its_reference():
    """The test above's arguments, valid: the op's result is the torch reference's (so the refusals are not of a
    malformed call)."""
    a = step_args(B=2, cap=6, length=3, seed=3)
    want, k, v = step_reference(a)
    if not call_step(a):
        pytest.skip("the fused step declines on this CPU (neither AVX-512 nor AVX2)")
    torch.testing.assert_close(a["out"], want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(a["cache_k"][0][:, :, 3], k, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(a["cache_v"][0][:, :, 3], v, rtol=1e-5, atol=1e-5)


ISAS = ["avx512bf16", "avx512", "avx2"]
BEST = torch.ops.wide_cpu.isa().split(" ")[0] if cpu.available() else "scalar"
HERE = ISAS[ISAS.index(BEST):] if BEST in ISAS else []


@pytest.fixture()
def isa(request):
    before = torch.ops.wide_cpu.set_isa(request.param)
    yield request.param
    torch.ops.wide_cpu.set_isa(before)


def _attention_case(what: str, L: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    q, k, v = torch.randn(2, 4, 1, 16, generator=g), torch.randn(2, 2, L, 16, generator=g), \
        torch.randn(2, 2, L, 16, generator=g)
    if what == "nan key":
        k[0, 1, L // 2, 3] = float("nan")
    elif what == "inf query":
        q[1, 2, 0, 5] = float("inf")
    elif what == "-inf key":
        k[1, 0, 1, :] = float("-inf")
    elif what == "all far below zero":  # every score < -87: an exp clamped there weighs them alike
        q, k = q.abs() * 30, -k.abs() * 30
        k[:, :, 0] *= 2
    return q, k, v


@pytest.mark.skipif(not HERE, reason="decode attention needs AVX-512 or AVX2")
@pytest.mark.parametrize("isa", HERE, indirect=True)
@pytest.mark.parametrize("what", ["nan key", "inf query", "-inf key", "all far below zero"])
@pytest.mark.parametrize("L", [5, 16, 21])
def test_decode_attention_propagates_nan_and_inf_as_the_reference(isa, what, L):
    q, k, v = _attention_case(what, L, seed=L)
    got = cpu.decode_attention(q, k, v)
    assert got is not None
    want = ref.masked_attention(q, k, v)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, equal_nan=True)
    if what in ("nan key", "inf query"):
        assert got.isnan().any()
