"""The OpenAI Triton kernels of the `wide` ops: the ONE place their code lives.

The same source runs three ways:
- on CUDA tensors, JIT-compiled by Triton (``wide_export.kernels``);
- on CPU tensors under ``TRITON_INTERPRET=1`` (the CI tests execute these
  very kernels, tile mapping, masks and tails included);
- compiled ahead of time to sm_80 / sm_90 cubins (``wide_export.kernels.aot``,
  ``triton.tools.compile``) that the TensorRT plugins launch through the CUDA
  driver API.

This module imports nothing but triton: ``triton.tools.compile`` executes it.

Layouts (docs/opset.md): x rows of length K with row stride ``ldx``; weights
``[N, K]`` contiguous (nn.Linear); mask int32 ``[M, G]`` contiguous; outputs
``[M, N]`` contiguous. Accumulation is float32 everywhere.

Kernels:
- ``wide_router_kernel``: compressor + router GEMMs and the ``l0 >= l1`` rule.
- ``wide_gemv_n_kernel`` (decode, N-pruned, optional gated / bias): one
  program per (token, BLOCK_N output channels); weight rows of the token's
  skipped groups are not loaded (predicated loads; a tile with no executing
  channel skips its K loop and writes zeros). The grid puts the tokens of one
  weight tile next to each other so rows that share a tile share it through
  L2 instead of re-reading HBM.
- ``wide_gemv_k_kernel`` (decode, K-pruned, optional bias added to every output): per-token; weight loads are
  predicated on the token's own group mask, so skipped groups' bytes are not
  fetched (32-byte sector granularity), whatever the group size.
- ``wide_group_rows_kernel``: per group, the rows that execute it first, then
  the rest ("mask reordering"; vLLM's ``moe_align_block_size`` plays this
  role for MoE experts), plus the count of executing rows.
- ``wide_grouped_gemm_n_kernel`` (prefill, N-pruned, optional gated / bias):
  a grouped GEMM over those row lists, each group an "expert" of
  ``group_size`` output channels: tiles past a group's count only write
  zeros.
- ``wide_grouped_gemm_k_kernel`` (prefill, K-pruned): per group, the rows
  that execute it times that group's K slice, scatter-added in float32
  (the WIDE authors' sort-and-scatter-add), then ``wide_cast_kernel`` (which adds the bias).
- ``wide_tile_gemm_k_kernel`` (K-pruned, any M, optional bias): row tiles in token order;
  a group's K slice is skipped when no row of the tile executes it, other
  rows' inputs are masked to zero.
- ``wide_tile_gemm_n_kernel`` (N-pruned, any M, any group size): a tile GEMM
  with the mask in the epilogue; a tile with no executing (row, group) pair
  skips its K loop.
- ``wide_apply_mask_kernel``: the mask pass of the plugins' cuBLASLt dense
  path (exact zeros on skipped groups; gated: silu(gate) * up).
"""

import triton
import triton.language as tl


@triton.jit
def _mma(a, b, acc, PRECISE: tl.constexpr):
    """acc += a @ b; PRECISE: float32 operands, IEEE products (fp32 data, or bf16 in the interpreter)."""
    if PRECISE:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc)


@triton.jit
def _gemm_rows(x_ptr, w_ptr, w2_ptr, rows, row_ok, rn, n_ok, K, ldx, acc, acc2,
               GATED: tl.constexpr, PRECISE: tl.constexpr, BLOCK_K: tl.constexpr):
    """acc (+ acc2 for the up weight) += x[rows] @ W[rn]^T over all of K; rows may be gathered."""
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        k_ok = rk < K
        a = tl.load(x_ptr + rows[:, None] * ldx + rk[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(w_ptr + rn[None, :] * K + rk[:, None], mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        acc = _mma(a, b, acc, PRECISE)
        if GATED:
            b2 = tl.load(w2_ptr + rn[None, :] * K + rk[:, None], mask=k_ok[:, None] & n_ok[None, :], other=0.0)
            acc2 = _mma(a, b2, acc2, PRECISE)
    return acc, acc2


@triton.jit
def _epilogue_n(acc, acc2, b_ptr, rn, n_ok, keep, HAS_BIAS: tl.constexpr, GATED: tl.constexpr):
    """Bias, silu(gate) * up, and exact zeros where `keep` is false."""
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    if GATED:
        acc = acc * tl.sigmoid(acc) * acc2
    return tl.where(keep, acc, 0.0)


@triton.jit
def wide_router_kernel(x_ptr, wc_ptr, bc_ptr, wr_ptr, br_ptr, mask_ptr, M, H, R, G, ldx,
                       BLOCK_M: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_R: tl.constexpr,
                       BLOCK_G: tl.constexpr):
    pid = tl.program_id(0)
    rm = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    rr = tl.arange(0, BLOCK_R)
    m_ok = rm < M
    r_ok = rr < R
    z = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
    for h0 in range(0, H, BLOCK_H):
        rh = h0 + tl.arange(0, BLOCK_H)
        h_ok = rh < H
        x = tl.load(x_ptr + rm[:, None] * ldx + rh[None, :], mask=m_ok[:, None] & h_ok[None, :], other=0.0)
        wc = tl.load(wc_ptr + rr[None, :] * H + rh[:, None], mask=r_ok[None, :] & h_ok[:, None], other=0.0)
        z = tl.dot(x.to(tl.float32), wc, z, input_precision="ieee")
    z += tl.load(bc_ptr + rr, mask=r_ok, other=0.0)[None, :]
    for g0 in range(0, G, BLOCK_G):
        rg = g0 + tl.arange(0, BLOCK_G)
        g_ok = rg < G
        w_ok = g_ok[None, :] & r_ok[:, None]
        w0 = tl.load(wr_ptr + (2 * rg[None, :]) * R + rr[:, None], mask=w_ok, other=0.0)
        w1 = tl.load(wr_ptr + (2 * rg[None, :] + 1) * R + rr[:, None], mask=w_ok, other=0.0)
        l0 = tl.dot(z, w0, input_precision="ieee") + tl.load(br_ptr + 2 * rg, mask=g_ok, other=0.0)[None, :]
        l1 = tl.dot(z, w1, input_precision="ieee") + tl.load(br_ptr + 2 * rg + 1, mask=g_ok, other=0.0)[None, :]
        tl.store(mask_ptr + rm[:, None] * G + rg[None, :], (l0 >= l1).to(tl.int32),
                 mask=m_ok[:, None] & g_ok[None, :])


@triton.jit
def wide_gemv_n_kernel(x_ptr, w_ptr, w2_ptr, b_ptr, mask_ptr, y_ptr, M, N, K, G, group_size, ldx,
                       HAS_BIAS: tl.constexpr, GATED: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # grid (M, cdiv(N, BLOCK_N)): tokens fastest, so the M programs of a weight tile run together.
    m = tl.program_id(0)
    pn = tl.program_id(1)
    rn = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < N
    # this token's decision for each output channel's group; weight rows of skipped groups are not loaded.
    act = (tl.load(mask_ptr + m * G + rn // group_size, mask=n_ok, other=0) != 0) & n_ok
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_N,), dtype=tl.float32)
    if tl.max(act.to(tl.int32), axis=0) > 0:
        for k0 in range(0, K, BLOCK_K):
            rk = k0 + tl.arange(0, BLOCK_K)
            k_ok = rk < K
            xk = tl.load(x_ptr + m * ldx + rk, mask=k_ok, other=0.0).to(tl.float32)
            w_ok = act[:, None] & k_ok[None, :]
            w = tl.load(w_ptr + rn[:, None] * K + rk[None, :], mask=w_ok, other=0.0)
            acc += tl.sum(w.to(tl.float32) * xk[None, :], axis=1)
            if GATED:
                w2 = tl.load(w2_ptr + rn[:, None] * K + rk[None, :], mask=w_ok, other=0.0)
                acc2 += tl.sum(w2.to(tl.float32) * xk[None, :], axis=1)
        if HAS_BIAS:
            acc += tl.load(b_ptr + rn, mask=act, other=0.0).to(tl.float32)
        if GATED:
            acc = acc * tl.sigmoid(acc) * acc2
        acc = tl.where(act, acc, 0.0)
    tl.store(y_ptr + m * N + rn, acc.to(y_ptr.dtype.element_ty), mask=n_ok)


@triton.jit
def wide_gemv_k_kernel(x_ptr, w_ptr, b_ptr, mask_ptr, y_ptr, M, N, K, G, group_size, ldx,
                       HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    m = tl.program_id(0)
    pn = tl.program_id(1)
    rn = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < N
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        k_ok = rk < K
        # this token's decision for the group of each k: predicated loads skip the bytes.
        act = tl.load(mask_ptr + m * G + rk // group_size, mask=k_ok, other=0) != 0
        if tl.max(act.to(tl.int32), axis=0) > 0:
            xk = tl.load(x_ptr + m * ldx + rk, mask=act, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + rn[:, None] * K + rk[None, :], mask=n_ok[:, None] & act[None, :], other=0.0)
            acc += tl.sum(w.to(tl.float32) * xk[None, :], axis=1)
    if HAS_BIAS:  # outputs are not grouped: the bias is added whatever the mask
        acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + m * N + rn, acc.to(y_ptr.dtype.element_ty), mask=n_ok)


@triton.jit
def wide_group_rows_kernel(mask_ptr, rows_ptr, counts_ptr, M, G, BLOCK: tl.constexpr):
    # grid (G,): rows[g, :count] = the rows executing group g (ascending), rows[g, count:] = the others.
    g = tl.program_id(0)
    n_act = 0
    for m0 in range(0, M, BLOCK):
        rm = m0 + tl.arange(0, BLOCK)
        a = tl.load(mask_ptr + rm * G + g, mask=rm < M, other=0) != 0
        n_act += tl.sum(a.to(tl.int32), axis=0)
    base_a = 0
    base_i = n_act
    for m0 in range(0, M, BLOCK):
        rm = m0 + tl.arange(0, BLOCK)
        in_m = rm < M
        a = (tl.load(mask_ptr + rm * G + g, mask=in_m, other=0) != 0) & in_m
        i = in_m & (a == 0)
        ai = a.to(tl.int32)
        ii = i.to(tl.int32)
        tl.store(rows_ptr + g * M + base_a + tl.cumsum(ai, axis=0) - 1, rm, mask=a)
        tl.store(rows_ptr + g * M + base_i + tl.cumsum(ii, axis=0) - 1, rm, mask=i)
        base_a += tl.sum(ai, axis=0)
        base_i += tl.sum(ii, axis=0)
    tl.store(counts_ptr + g, n_act)


@triton.jit
def wide_grouped_gemm_n_kernel(x_ptr, w_ptr, w2_ptr, b_ptr, rows_ptr, counts_ptr, y_ptr, M, N, K, group_size, ldx,
                               HAS_BIAS: tl.constexpr, GATED: tl.constexpr, PRECISE: tl.constexpr,
                               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # grid (cdiv(M, BLOCK_M), N // BLOCK_N); BLOCK_N divides group_size.
    pm = tl.program_id(0)
    pn = tl.program_id(1)
    n0 = pn * BLOCK_N
    g = n0 // group_size
    count = tl.load(counts_ptr + g)
    ri = pm * BLOCK_M + tl.arange(0, BLOCK_M)
    in_m = ri < M
    rows = tl.load(rows_ptr + g * M + ri, mask=in_m, other=0)
    act = ri < count
    rn = n0 + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if pm * BLOCK_M < count:
        acc, acc2 = _gemm_rows(x_ptr, w_ptr, w2_ptr, rows, act, rn, rn < N, K, ldx, acc, acc2,
                               GATED, PRECISE, BLOCK_K)
        acc = _epilogue_n(acc, acc2, b_ptr, rn, rn < N, act[:, None], HAS_BIAS, GATED)
    tl.store(y_ptr + rows[:, None] * N + rn[None, :], acc.to(y_ptr.dtype.element_ty), mask=in_m[:, None])


@triton.jit
def wide_grouped_gemm_k_kernel(x_ptr, w_ptr, rows_ptr, counts_ptr, acc_ptr, M, N, K, group_size, ldx,
                               PRECISE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                               BLOCK_K: tl.constexpr):
    # grid (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N), G): acc_ptr is a zeroed float32 [M, N].
    pm = tl.program_id(0)
    pn = tl.program_id(1)
    g = tl.program_id(2)
    count = tl.load(counts_ptr + g)
    if pm * BLOCK_M < count:
        ri = pm * BLOCK_M + tl.arange(0, BLOCK_M)
        act = ri < count
        rows = tl.load(rows_ptr + g * M + ri, mask=act, other=0)
        rn = pn * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = rn < N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kk in range(0, group_size, BLOCK_K):
            rj = kk + tl.arange(0, BLOCK_K)
            j_ok = rj < group_size
            rk = g * group_size + rj
            a = tl.load(x_ptr + rows[:, None] * ldx + rk[None, :], mask=act[:, None] & j_ok[None, :], other=0.0)
            b = tl.load(w_ptr + rn[None, :] * K + rk[:, None], mask=j_ok[:, None] & n_ok[None, :], other=0.0)
            acc = _mma(a, b, acc, PRECISE)
        tl.atomic_add(acc_ptr + rows[:, None] * N + rn[None, :], acc, mask=act[:, None] & n_ok[None, :], sem="relaxed")


@triton.jit
def wide_tile_gemm_k_kernel(x_ptr, w_ptr, b_ptr, mask_ptr, y_ptr, M, N, K, G, group_size, ldx,
                            HAS_BIAS: tl.constexpr, PRECISE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                            BLOCK_K: tl.constexpr):
    # grid (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N))
    pm = tl.program_id(0)
    pn = tl.program_id(1)
    rm = pm * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = rm < M
    rn = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for g in range(0, G):
        act = (tl.load(mask_ptr + rm * G + g, mask=m_ok, other=0) != 0) & m_ok
        if tl.max(act.to(tl.int32), axis=0) > 0:
            for kk in range(0, group_size, BLOCK_K):
                rj = kk + tl.arange(0, BLOCK_K)
                j_ok = rj < group_size
                rk = g * group_size + rj
                a = tl.load(x_ptr + rm[:, None] * ldx + rk[None, :], mask=act[:, None] & j_ok[None, :], other=0.0)
                b = tl.load(w_ptr + rn[None, :] * K + rk[:, None], mask=j_ok[:, None] & n_ok[None, :], other=0.0)
                acc = _mma(a, b, acc, PRECISE)
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + rm[:, None] * N + rn[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def wide_cast_kernel(src_ptr, dst_ptr, b_ptr, numel, N, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    """float32 [M, N] (+ bias [N]) -> dst dtype (the scatter-add accumulator to the output)."""
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = r < numel
    v = tl.load(src_ptr + r, mask=ok, other=0.0)
    if HAS_BIAS:
        v += tl.load(b_ptr + r % N, mask=ok, other=0.0).to(tl.float32)
    tl.store(dst_ptr + r, v.to(dst_ptr.dtype.element_ty), mask=ok)


@triton.jit
def wide_tile_gemm_n_kernel(x_ptr, w_ptr, w2_ptr, b_ptr, mask_ptr, y_ptr, M, N, K, G, group_size, ldx,
                            HAS_BIAS: tl.constexpr, GATED: tl.constexpr, PRECISE: tl.constexpr,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # grid (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N)): a plain tile GEMM with the mask in the epilogue; a tile
    # none of whose (row, group) pairs executes skips its K loop. Any group size.
    pm = tl.program_id(0)
    pn = tl.program_id(1)
    rm = pm * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = rm < M
    rn = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < N
    ok = m_ok[:, None] & n_ok[None, :]
    act = (tl.load(mask_ptr + rm[:, None] * G + rn[None, :] // group_size, mask=ok, other=0) != 0) & ok
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if tl.max(tl.max(act.to(tl.int32), axis=1), axis=0) > 0:
        acc, acc2 = _gemm_rows(x_ptr, w_ptr, w2_ptr, rm, m_ok, rn, n_ok, K, ldx, acc, acc2, GATED, PRECISE, BLOCK_K)
        acc = _epilogue_n(acc, acc2, b_ptr, rn, n_ok, act, HAS_BIAS, GATED)
    tl.store(y_ptr + rm[:, None] * N + rn[None, :], acc.to(y_ptr.dtype.element_ty), mask=ok)


@triton.jit
def wide_apply_mask_kernel(src_ptr, src2_ptr, dst_ptr, mask_ptr, M, N, G, group_size, ld_src,
                           GATED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The mask pass of the plugins' dense (cuBLASLt) path: dst[m, n] = v if mask[m, n // group_size] else 0,
    v = src[m, n] or, GATED, silu(src[m, n]) * src2[m, n] (float32 math); dst and src2 are [M, N] contiguous,
    src rows have stride ld_src (dst may be src). Skipped entries are exact zeros whatever src holds."""
    # grid (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N))
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = (rm < M)[:, None] & (rn < N)[None, :]
    keep = (tl.load(mask_ptr + rm[:, None] * G + rn[None, :] // group_size, mask=ok, other=0) != 0) & ok
    v = tl.load(src_ptr + rm[:, None] * ld_src + rn[None, :], mask=keep, other=0.0).to(tl.float32)
    if GATED:
        u = tl.load(src2_ptr + rm[:, None] * N + rn[None, :], mask=keep, other=0.0).to(tl.float32)
        v = v * tl.sigmoid(v) * u
    tl.store(dst_ptr + rm[:, None] * N + rn[None, :], tl.where(keep, v, 0.0).to(dst_ptr.dtype.element_ty), mask=ok)
