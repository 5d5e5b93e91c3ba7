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
    # The model's attention (reference.attention): KV heads repeated for GQA (Unsqueeze + Expand + Reshape, as
    # transformers' repeat_kv), scores in q's dtype scaled through float32 as torch scales a half tensor by a
    # float (rounded once, to q's dtype), the float32 floor where not allowed, softmax in float32, then the
    # heads of skipped groups multiplied by 0.
    "WideMaskedAttention": """
<domain: "wide", opset_import: ["": {opset}]>
WideMaskedAttention <group_heads> (q, k, v, allowed, head_mask) => (y)
{
    i0 = Constant <value_ints = [0]> ()
    i1 = Constant <value_ints = [1]> ()
    i2 = Constant <value_ints = [2]> ()
    i3 = Constant <value_ints = [3]> ()
    i4 = Constant <value_ints = [4]> ()
    last = Constant <value_ints = [-1]> ()
    qs = Shape (q)
    ks = Shape (k)
    b = Slice (qs, i0, i1)
    hq = Slice (qs, i1, i2)
    t = Slice (qs, i2, i3)
    d = Slice (qs, i3, i4)
    hk = Slice (ks, i1, i2)
    s = Slice (ks, i2, i3)
    rep = Div (hq, hk)
    wide_shape = Concat <axis = 0> (b, hk, rep, s, d)
    heads_shape = Concat <axis = 0> (b, hq, s, d)
    k5 = Unsqueeze (k, i2)
    v5 = Unsqueeze (v, i2)
    k_wide = Expand (k5, wide_shape)
    v_wide = Expand (v5, wide_shape)
    k_heads = Reshape (k_wide, heads_shape)
    v_heads = Reshape (v_wide, heads_shape)
    k_t = Transpose <perm = [0, 1, 3, 2]> (k_heads)
    qk = MatMul (q, k_t)
    qk32 = Cast <to = 1> (qk)
    d32 = Cast <to = 1> (d)
    root = Sqrt (d32)
    scale = Reciprocal (root)
    scaled32 = Mul (qk32, scale)
    scaled = CastLike (scaled32, q)
    scores = Cast <to = 1> (scaled)
    floor = Constant <value_float = -3.4028234663852886e+38> ()
    masked = Where (allowed, scores, floor)
    probs = Softmax <axis = -1> (masked)
    probs_v = CastLike (probs, v)
    o = MatMul (probs_v, v_heads)
    gh_scalar = Constant <value_int: int = @group_heads> ()
    gh = Unsqueeze (gh_scalar, i0)
    m_bgt = Transpose <perm = [0, 2, 1]> (head_mask)
    m4 = Unsqueeze (m_bgt, i2)
    ms = Shape (m4)
    m_lead = Slice (ms, i0, i2)
    m_wide_shape = Concat <axis = 0> (m_lead, gh, t)
    m_wide = Expand (m4, m_wide_shape)
    m_heads_shape = Concat <axis = 0> (b, hq, t)
    m_heads = Reshape (m_wide, m_heads_shape)
    m_col = Unsqueeze (m_heads, last)
    keep = CastLike (m_col, o)
    y = Mul (o, keep)
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
