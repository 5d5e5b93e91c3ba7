"""Standard-op function bodies of the `wide` ops, so any ONNX runtime runs the graph.

Written in the ONNX textual syntax (onnx.parser) rather than traced: the
bodies are short, and attributes must stay attribute *references* (`@group_size`)
so one function serves every node of an op type.
"""

from __future__ import annotations

from wide_export.ops.spec import DOMAIN, OPSET_VERSION

# Shared fragment: expand an int32 [.., G] mask to a 0/1 tensor like `like` of shape [.., G*gs].
_EXPAND = """
    gs_scalar = Constant <value_int: int = @group_size> ()
    gs = Unsqueeze (gs_scalar, zero)
    m_unsq = Unsqueeze (mask, minus_one)
    m_shape = Shape (m_unsq)
    m_lead = Slice (m_shape, zero, minus_one)
    m_target = Concat <axis = 0> (m_lead, gs)
    m_exp = Expand (m_unsq, m_target)
    flat_shape = Constant <value_ints = [0, 0, -1]> ()
    m_flat = Reshape (m_exp, flat_shape)
    m_cast = CastLike (m_flat, {like})
"""
_CONSTS = """
    minus_one = Constant <value_ints = [-1]> ()
    zero = Constant <value_ints = [0]> ()
"""

SOURCES = {
    "WideRouter": """
<domain: "wide", opset_import: ["": {opset}]>
WideRouter <num_groups> (hidden, compressor_weight, compressor_bias, router_weight, router_bias) => (mask)
{
    h32 = Cast <to = 1> (hidden)
    wc_t = Transpose <perm = [1, 0]> (compressor_weight)
    z0 = MatMul (h32, wc_t)
    z = Add (z0, compressor_bias)
    wr_t = Transpose <perm = [1, 0]> (router_weight)
    l0 = MatMul (z, wr_t)
    l = Add (l0, router_bias)
    pair_shape = Constant <value_ints = [0, 0, -1, 2]> ()
    lp = Reshape (l, pair_shape)
    idx0 = Constant <value_int = 0> ()
    idx1 = Constant <value_int = 1> ()
    run = Gather <axis = -1> (lp, idx0)
    skip = Gather <axis = -1> (lp, idx1)
    decision = GreaterOrEqual (run, skip)
    mask = Cast <to = 6> (decision)
}
""",
    "WideMaskedGemmN": """
<domain: "wide", opset_import: ["": {opset}]>
WideMaskedGemmN <group_size, has_bias> (x, weight, mask, bias) => (y)
{
""" + _CONSTS + _EXPAND.format(like="x") + """
    w_t = Transpose <perm = [1, 0]> (weight)
    xw = MatMul (x, w_t)
    xwb = Add (xw, bias)
    y = Mul (xwb, m_cast)
}
""",
    "WideMaskedGatedMlp": """
<domain: "wide", opset_import: ["": {opset}]>
WideMaskedGatedMlp <group_size> (x, gate_weight, up_weight, mask) => (y)
{
""" + _CONSTS + _EXPAND.format(like="x") + """
    wg_t = Transpose <perm = [1, 0]> (gate_weight)
    wu_t = Transpose <perm = [1, 0]> (up_weight)
    g = MatMul (x, wg_t)
    u = MatMul (x, wu_t)
    sg = Sigmoid (g)
    silu = Mul (g, sg)
    act = Mul (silu, u)
    y = Mul (act, m_cast)
}
""",
    "WideMaskedGemmK": """
<domain: "wide", opset_import: ["": {opset}]>
WideMaskedGemmK <group_size, has_bias> (x, weight, mask, bias) => (y)
{
""" + _CONSTS + _EXPAND.format(like="x") + """
    keep = Cast <to = 9> (m_flat)
    zero_like = CastLike (zero, x)
    xm = Where (keep, x, zero_like)
    w_t = Transpose <perm = [1, 0]> (weight)
    xw = MatMul (xm, w_t)
    y = Add (xw, bias)
}
""",
}


def function_protos(opset: int = 18) -> list:
    """One onnx.FunctionProto per `wide` op (domain `wide`, name = op_type), importing the
    model's default-domain `opset` (ONNX requires the versions to agree)."""
    import onnx.parser

    protos = []
    for name, src in SOURCES.items():
        fn = onnx.parser.parse_function(src.replace("{opset}", str(opset)))
        assert fn.name == name and fn.domain == DOMAIN
        protos.append(fn)
    return protos


OPSET_IMPORT = {DOMAIN: OPSET_VERSION}
