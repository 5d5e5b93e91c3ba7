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
- ``wide_router_kernel``: compressor + router GEMMs and the ``l0 >= l1`` rule,
  one program per 16 tokens (prefill).
- ``wide_router_split_kernel`` + ``wide_router_logits_kernel`` (decode): the
  compressor GEMM split over many programs (token tile x 8 compressor rows x
  a slice of H), partial sums in float32 ``[S, M, R]``, then one small
  program per 16 tokens sums the S partials in a fixed order (deterministic)
  and applies the router GEMM and the rule.
- ``wide_gemv_n_kernel`` (decode, N-pruned, optional gated / bias): split-K
  like ``wide_gemv_k_kernel``: one program per (token, BLOCK_N output
  channels, range of K chunks); weight rows of the token's skipped groups are
  not loaded, and a tile none of whose channels executes skips its K loop.
  Products accumulate in a ``[BLOCK_N, BLOCK_K]`` float32 register tile,
  reduced once after the loop. One split applies bias / silu(gate) * up /
  the mask and writes y; several write float32 partials (gated: gate and up)
  that ``wide_splitk_reduce_kernel`` sums and finishes. The grid puts the
  tokens of one weight tile next to each other so rows that share a tile
  share it through L2 instead of re-reading HBM.
- ``wide_gemv_k_kernel`` (decode, K-pruned, optional bias added to every
  output): split-K, TEAL's ``sparse_gemv`` schedule for row-major weights:
  one program per (token, BLOCK_N outputs, range of K chunks); a chunk whose
  lanes all belong to skipped groups is not loaded, others are predicated on
  the token's group mask; register accumulation, one reduction; with one
  split the program writes the output, else float32 partials ``[S, M, N]``
  that ``wide_splitk_reduce_kernel`` sums in a fixed order (+ bias, cast).
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
def _row_offsets(rows, stride):
    """rows * stride in int64: a prefill's x ([M, K]) or y ([M, N]) can pass 2^31 elements (128k tokens x
    28672 channels), where int32 offsets wrap to addresses outside the tensor. Weights ([N, K], below 2^31
    for every supported model) and masks ([M, G]) keep int32 offsets."""
    return rows.to(tl.int64) * stride


@triton.jit
def _tile_order(GROUP_M: tl.constexpr):
    """(pm, pn) of this program in a grid (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N)): the launch order (program_id 0
    fastest) walks GROUP_M row tiles across every column tile before the next GROUP_M rows (the L2 swizzle
    of Triton's matmul tutorial): the programs running together read GROUP_M row tiles of x and a band of
    weight tiles, so neither x nor W streams from HBM once per tile of the other, as plain row-major order
    does when x outgrows L2 (16k tokens x 4096 bf16 = 128 MB against H200's 50 MB)."""
    num_m = tl.num_programs(0)
    pid = tl.program_id(1) * num_m + tl.program_id(0)
    width = GROUP_M * tl.num_programs(1)
    first_m = (pid // width) * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    return first_m + (pid % width) % size_m, (pid % width) // size_m


@triton.jit
def _gemm_rows(x_ptr, w_ptr, w2_ptr, x_off, row_ok, rn, n_ok, K, acc, acc2,
               GATED: tl.constexpr, PRECISE: tl.constexpr, BLOCK_K: tl.constexpr):
    """acc (+ acc2 for the up weight) += x[rows] @ W[rn]^T over all of K; x_off: each row's element offset
    from x_ptr (gathered rows: int64, _row_offsets; a tile's own rows: int32 from the tile's int64 base)."""
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        k_ok = rk < K
        a = tl.load(x_ptr + x_off[:, None] + rk[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
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
def _router_decide(z, wr_ptr, br_ptr, mask_ptr, rm, m_ok, rr, r_ok, R, G, BLOCK_G: tl.constexpr):
    """mask[rm, g] = (z Wr[2g]^T + br[2g] >= z Wr[2g+1]^T + br[2g+1]) for every group, BLOCK_G at a time."""
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
def wide_router_kernel(x_ptr, wc_ptr, bc_ptr, wr_ptr, br_ptr, mask_ptr, M, H, R, G, ldx,
                       BLOCK_M: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_R: tl.constexpr,
                       BLOCK_G: tl.constexpr):
    # grid (cdiv(M, BLOCK_M),): prefill; each program streams the whole compressor weight.
    pid = tl.program_id(0)
    rm = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    rr = tl.arange(0, BLOCK_R)
    m_ok = rm < M
    r_ok = rr < R
    z = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
    for h0 in range(0, H, BLOCK_H):
        rh = h0 + tl.arange(0, BLOCK_H)
        h_ok = rh < H
        x = tl.load(x_ptr + _row_offsets(rm, ldx)[:, None] + rh[None, :], mask=m_ok[:, None] & h_ok[None, :],
                    other=0.0)
        wc = tl.load(wc_ptr + rr[None, :] * H + rh[:, None], mask=r_ok[None, :] & h_ok[:, None], other=0.0)
        z = tl.dot(x.to(tl.float32), wc, z, input_precision="ieee")
    z += tl.load(bc_ptr + rr, mask=r_ok, other=0.0)[None, :]
    _router_decide(z, wr_ptr, br_ptr, mask_ptr, rm, m_ok, rr, r_ok, R, G, BLOCK_G)


@triton.jit(do_not_specialize=["M", "chunks_per_split"])  # values vary per call; nothing to gain
def wide_router_split_kernel(x_ptr, wc_ptr, part_ptr, M, H, R, ldx, chunks_per_split,
                             BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr):
    # grid (cdiv(M, BLOCK_M), cdiv(R, BLOCK_R), S): part[s, m, r] = sum over split s's H chunks of x[m, h] wc[r, h].
    pm = tl.program_id(0)
    pr = tl.program_id(1)
    s = tl.program_id(2)
    rm = pm * BLOCK_M + tl.arange(0, BLOCK_M)
    rr = pr * BLOCK_R + tl.arange(0, BLOCK_R)
    m_ok = rm < M
    r_ok = rr < R
    acc = tl.zeros((BLOCK_M, BLOCK_R, BLOCK_H), dtype=tl.float32)
    c0 = s * chunks_per_split
    for c in range(c0, tl.minimum(c0 + chunks_per_split, tl.cdiv(H, BLOCK_H))):
        rh = c * BLOCK_H + tl.arange(0, BLOCK_H)
        h_ok = rh < H
        x = tl.load(x_ptr + rm[:, None] * ldx + rh[None, :], mask=m_ok[:, None] & h_ok[None, :], other=0.0)
        wc = tl.load(wc_ptr + rr[:, None] * H + rh[None, :], mask=r_ok[:, None] & h_ok[None, :], other=0.0)
        acc += x.to(tl.float32)[:, None, :] * wc[None, :, :]
    z = tl.sum(acc, axis=2)  # the one reduction
    tl.store(part_ptr + s * M * R + rm[:, None] * R + rr[None, :], z, mask=m_ok[:, None] & r_ok[None, :])


@triton.jit(do_not_specialize=["S"])  # values vary per call; nothing to gain
def wide_router_logits_kernel(part_ptr, bc_ptr, wr_ptr, br_ptr, mask_ptr, M, R, G, S,
                              BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_G: tl.constexpr):
    # grid (cdiv(M, BLOCK_M),): z = the S partials summed in split order + bc, then the router rule.
    pid = tl.program_id(0)
    rm = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    rr = tl.arange(0, BLOCK_R)
    m_ok = rm < M
    r_ok = rr < R
    ok = m_ok[:, None] & r_ok[None, :]
    z = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
    for s in range(0, S):
        z += tl.load(part_ptr + s * M * R + rm[:, None] * R + rr[None, :], mask=ok, other=0.0)
    z += tl.load(bc_ptr + rr, mask=r_ok, other=0.0)[None, :]
    _router_decide(z, wr_ptr, br_ptr, mask_ptr, rm, m_ok, rr, r_ok, R, G, BLOCK_G)


@triton.jit(do_not_specialize=["M", "chunks_per_split"])  # values vary per call; nothing to gain
def wide_gemv_n_kernel(x_ptr, w_ptr, w2_ptr, b_ptr, mask_ptr, y_ptr, part_ptr, M, N, K, G, group_size, ldx,
                       chunks_per_split, HAS_BIAS: tl.constexpr, GATED: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # grid (M, cdiv(N, BLOCK_N), S): tokens fastest, so the M programs of a weight tile run together;
    # program (m, pn, s) covers K chunks [s * chunks_per_split, ...) of token m's BLOCK_N outputs.
    m = tl.program_id(0)
    pn = tl.program_id(1)
    s = tl.program_id(2)
    rn = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < N
    # this token's decision for each output channel's group; weight rows of skipped groups are not loaded.
    act = (tl.load(mask_ptr + m * G + rn // group_size, mask=n_ok, other=0) != 0) & n_ok
    out = tl.zeros((BLOCK_N,), dtype=tl.float32)
    up = tl.zeros((BLOCK_N,), dtype=tl.float32)
    if tl.max(act.to(tl.int32), axis=0) > 0:  # else: an output tile of skipped groups, zeros without a K loop
        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        acc2 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        c0 = s * chunks_per_split
        for c in range(c0, tl.minimum(c0 + chunks_per_split, tl.cdiv(K, BLOCK_K))):
            rk = c * BLOCK_K + tl.arange(0, BLOCK_K)
            k_ok = rk < K
            xk = tl.load(x_ptr + m * ldx + rk, mask=k_ok, other=0.0).to(tl.float32)
            w_ok = act[:, None] & k_ok[None, :]
            w = tl.load(w_ptr + rn[:, None] * K + rk[None, :], mask=w_ok, other=0.0)
            acc += w.to(tl.float32) * xk[None, :]
            if GATED:
                w2 = tl.load(w2_ptr + rn[:, None] * K + rk[None, :], mask=w_ok, other=0.0)
                acc2 += w2.to(tl.float32) * xk[None, :]
        out = tl.sum(acc, axis=1)  # the one reduction across K lanes
        if GATED:
            up = tl.sum(acc2, axis=1)
        if HAS_BIAS:
            if s == 0:  # once per output: in the only split, or in split 0's partial
                out += tl.load(b_ptr + rn, mask=act, other=0.0).to(tl.float32)
    if tl.num_programs(2) == 1:  # one split: this program owns the output
        if GATED:
            out = out * tl.sigmoid(out) * up
        out = tl.where(act, out, 0.0)
        tl.store(y_ptr + m * N + rn, out.to(y_ptr.dtype.element_ty), mask=n_ok)
    else:  # float32 partials [S, M, N] (gated: then the up partials [S, M, N]); skipped outputs hold exact zeros
        tl.store(part_ptr + s * M * N + m * N + rn, out, mask=n_ok)
        if GATED:
            tl.store(part_ptr + (tl.num_programs(2) + s) * M * N + m * N + rn, up, mask=n_ok)


@triton.jit(do_not_specialize=["M", "chunks_per_split"])  # values vary per call; nothing to gain
def wide_gemv_k_kernel(x_ptr, w_ptr, b_ptr, mask_ptr, y_ptr, part_ptr, M, N, K, G, group_size, ldx,
                       chunks_per_split, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # grid (M, cdiv(N, BLOCK_N), S): program (m, pn, s) covers K chunks [s * chunks_per_split, ...) of token m.
    m = tl.program_id(0)
    pn = tl.program_id(1)
    s = tl.program_id(2)
    rn = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < N
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    c0 = s * chunks_per_split
    for c in range(c0, tl.minimum(c0 + chunks_per_split, tl.cdiv(K, BLOCK_K))):
        rk = c * BLOCK_K + tl.arange(0, BLOCK_K)
        k_ok = rk < K
        # this token's decision for the group of each k: a chunk of skipped groups loads nothing, a chunk
        # straddling groups loads only the executing lanes (predicated, 32-byte sectors).
        act = (tl.load(mask_ptr + m * G + rk // group_size, mask=k_ok, other=0) != 0) & k_ok
        if tl.max(act.to(tl.int32), axis=0) > 0:
            xk = tl.load(x_ptr + m * ldx + rk, mask=act, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + rn[:, None] * K + rk[None, :], mask=n_ok[:, None] & act[None, :], other=0.0)
            acc += w.to(tl.float32) * xk[None, :]
    out = tl.sum(acc, axis=1)  # the one reduction across K lanes
    if tl.num_programs(2) == 1:  # one split: this program owns the output (bias: every output, mask or not)
        if HAS_BIAS:
            out += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)
        tl.store(y_ptr + m * N + rn, out.to(y_ptr.dtype.element_ty), mask=n_ok)
    else:
        tl.store(part_ptr + s * M * N + m * N + rn, out, mask=n_ok)


@triton.jit(do_not_specialize=["S"])  # values vary per call; nothing to gain
def wide_splitk_reduce_kernel(part_ptr, b_ptr, y_ptr, numel, N, S, HAS_BIAS: tl.constexpr, GATED: tl.constexpr,
                              BLOCK: tl.constexpr):
    """y = sum over s of part[s] (fixed order: deterministic) + bias, cast; part float32 [S, M, N].
    GATED: part holds the gate partials then the up partials, y = silu(gate) * up (0 where both are 0)."""
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = r < numel
    v = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(0, S):
        v += tl.load(part_ptr + s * numel + r, mask=ok, other=0.0)
    if GATED:
        u = tl.zeros((BLOCK,), dtype=tl.float32)
        for s in range(0, S):
            u += tl.load(part_ptr + (S + s) * numel + r, mask=ok, other=0.0)
        v = v * tl.sigmoid(v) * u
    if HAS_BIAS:
        v += tl.load(b_ptr + r % N, mask=ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + r, v.to(y_ptr.dtype.element_ty), mask=ok)


@triton.jit(do_not_specialize=["M"])  # row / group counts: not in a vectorised dim
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


@triton.jit(do_not_specialize=["M"])  # row / group counts: not in a vectorised dim
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
        acc, acc2 = _gemm_rows(x_ptr, w_ptr, w2_ptr, _row_offsets(rows, ldx), act, rn, rn < N, K, acc, acc2,
                               GATED, PRECISE, BLOCK_K)
        acc = _epilogue_n(acc, acc2, b_ptr, rn, rn < N, act[:, None], HAS_BIAS, GATED)
    tl.store(y_ptr + _row_offsets(rows, N)[:, None] + rn[None, :], acc.to(y_ptr.dtype.element_ty), mask=in_m[:, None])


@triton.jit(do_not_specialize=["M"])  # row / group counts: not in a vectorised dim
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
        x_rows = x_ptr + _row_offsets(rows, ldx)[:, None]  # the gathered rows' starts: once, not per K step
        for kk in range(0, group_size, BLOCK_K):
            rj = kk + tl.arange(0, BLOCK_K)
            j_ok = rj < group_size
            rk = g * group_size + rj
            a = tl.load(x_rows + rk[None, :], mask=act[:, None] & j_ok[None, :], other=0.0)
            b = tl.load(w_ptr + rn[None, :] * K + rk[:, None], mask=j_ok[:, None] & n_ok[None, :], other=0.0)
            acc = _mma(a, b, acc, PRECISE)
        tl.atomic_add(acc_ptr + _row_offsets(rows, N)[:, None] + rn[None, :], acc, mask=act[:, None] & n_ok[None, :], sem="relaxed")


@triton.jit(do_not_specialize=["M", "G"])  # row / group counts: not in a vectorised dim
def wide_tile_gemm_k_kernel(x_ptr, w_ptr, b_ptr, mask_ptr, y_ptr, M, N, K, G, group_size, ldx,
                            HAS_BIAS: tl.constexpr, PRECISE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                            BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    # grid (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N)), walked in _tile_order
    pm, pn = _tile_order(GROUP_M)
    r = tl.arange(0, BLOCK_M)
    rm = pm * BLOCK_M + r
    m_ok = rm < M
    rn = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < N
    x_tile = x_ptr + _row_offsets(pm * BLOCK_M, ldx)  # the tile's first row: int64; rows within it: int32
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for g in range(0, G):
        act = (tl.load(mask_ptr + rm * G + g, mask=m_ok, other=0) != 0) & m_ok
        if tl.max(act.to(tl.int32), axis=0) > 0:
            for kk in range(0, group_size, BLOCK_K):
                rj = kk + tl.arange(0, BLOCK_K)
                j_ok = rj < group_size
                rk = g * group_size + rj
                a = tl.load(x_tile + r[:, None] * ldx + rk[None, :], mask=act[:, None] & j_ok[None, :], other=0.0)
                b = tl.load(w_ptr + rn[None, :] * K + rk[:, None], mask=j_ok[:, None] & n_ok[None, :], other=0.0)
                acc = _mma(a, b, acc, PRECISE)
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + _row_offsets(pm * BLOCK_M, N) + r[:, None] * N + rn[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def wide_cast_kernel(src_ptr, dst_ptr, b_ptr, numel, N, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    """float32 [M, N] (+ bias [N]) -> dst dtype (the scatter-add accumulator to the output); M * N may pass 2^31."""
    r = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = r < numel
    v = tl.load(src_ptr + r, mask=ok, other=0.0)
    if HAS_BIAS:
        v += tl.load(b_ptr + r % N, mask=ok, other=0.0).to(tl.float32)
    tl.store(dst_ptr + r, v.to(dst_ptr.dtype.element_ty), mask=ok)


@triton.jit(do_not_specialize=["M", "G"])  # row / group counts: not in a vectorised dim
def wide_tile_gemm_n_kernel(x_ptr, w_ptr, w2_ptr, b_ptr, mask_ptr, y_ptr, M, N, K, G, group_size, ldx,
                            HAS_BIAS: tl.constexpr, GATED: tl.constexpr, PRECISE: tl.constexpr,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                            GROUP_M: tl.constexpr):
    # grid (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N)), walked in _tile_order: a plain tile GEMM with the mask in the
    # epilogue; a tile none of whose (row, group) pairs executes skips its K loop. Any group size.
    pm, pn = _tile_order(GROUP_M)
    r = tl.arange(0, BLOCK_M)
    rm = pm * BLOCK_M + r
    m_ok = rm < M
    rn = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < N
    ok = m_ok[:, None] & n_ok[None, :]
    act = (tl.load(mask_ptr + rm[:, None] * G + rn[None, :] // group_size, mask=ok, other=0) != 0) & ok
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if tl.max(tl.max(act.to(tl.int32), axis=1), axis=0) > 0:
        # the tile's first row at an int64 offset, rows within it at int32 ones (BLOCK_M x K <= 128 x K: no overflow)
        acc, acc2 = _gemm_rows(x_ptr + _row_offsets(pm * BLOCK_M, ldx), w_ptr, w2_ptr, r * ldx, m_ok, rn, n_ok, K,
                               acc, acc2, GATED, PRECISE, BLOCK_K)
        acc = _epilogue_n(acc, acc2, b_ptr, rn, n_ok, act, HAS_BIAS, GATED)
    tl.store(y_ptr + _row_offsets(pm * BLOCK_M, N) + r[:, None] * N + rn[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=ok)


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
    v = tl.load(src_ptr + _row_offsets(rm, ld_src)[:, None] + rn[None, :], mask=keep, other=0.0).to(tl.float32)
    if GATED:
        u = tl.load(src2_ptr + _row_offsets(rm, N)[:, None] + rn[None, :], mask=keep, other=0.0).to(tl.float32)
        v = v * tl.sigmoid(v) * u
    tl.store(dst_ptr + _row_offsets(rm, N)[:, None] + rn[None, :], tl.where(keep, v, 0.0).to(dst_ptr.dtype.element_ty), mask=ok)


# ---------------------------------------------------------------------------------------------------------
# Attention that leaves out the heads of skipped attention groups (WideMaskedAttention, docs/opset.md).
# q / k / v rows are D elements apart (head_dim contiguous); batch and head strides are arguments, so a
# preallocated KV cache is read in place. Softmax in float32 with the running maximum (online softmax).

ATTENTION_FLOOR = tl.constexpr(-3.4028234663852886e38)  # float32's lowest: the score the model gives a key it may not see


@triton.jit(do_not_specialize=["blocks_per_split"])
def wide_decode_attention_kernel(q_ptr, k_ptr, v_ptr, len_ptr, allowed_ptr, mask_ptr, out_ptr, pacc_ptr, pm_ptr, pl_ptr,
                                 Hq, G, D, REP, S, sab, sqb, sqh, skb, skh, svb, svh, scale, blocks_per_split,
                                 BLOCK_H: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_D: tl.constexpr,
                                 HAS_MASK: tl.constexpr, HAS_ALLOWED: tl.constexpr, PARTIAL: tl.constexpr,
                                 PRECISE: tl.constexpr):
    """Decode: one query per sequence. Program (sequence b, KV head kh, split s) scores the REP (<= BLOCK_H) query
    heads of kh that are active against keys [s * blocks_per_split * BLOCK_L, ...) of the sequence's length; a
    KV head none of whose query heads is active loads no key or value. HAS_ALLOWED (WideMaskedAttention): every
    sequence has S keys and allowed [B, 1, 1, S] (bytes, batch stride sab) says which it may see; a key not
    allowed is scored float32's lowest value, so a row allowed none gets the mean of every value (the reduce
    kernel keeps that across splits). Without PARTIAL: writes out (skipped heads 0); with it: float32 partials
    (acc, running max, sum) that wide_attention_reduce_kernel combines."""
    b = tl.program_id(0)
    kh = tl.program_id(1)
    s = tl.program_id(2)
    rh = tl.arange(0, BLOCK_H)
    rd = tl.arange(0, BLOCK_D)
    h = kh * REP + rh
    h_in = rh < REP
    h_ok = h_in
    if HAS_MASK:
        keep = tl.load(mask_ptr + b * G + h // (Hq // G), mask=h_in, other=0)
        h_ok = h_in & (keep != 0)
    active = tl.sum(h_ok.to(tl.int32), axis=0)
    d_ok = rd < D
    if HAS_ALLOWED:
        L = S
    else:
        L = tl.load(len_ptr + b)
    start = s * blocks_per_split * BLOCK_L
    end = tl.minimum(start + blocks_per_split * BLOCK_L, L)
    m_i = tl.full([BLOCK_H], ATTENTION_FLOOR, tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    if active > 0:
        q = tl.load(q_ptr + b * sqb + h[:, None] * sqh + rd[None, :], mask=h_ok[:, None] & d_ok[None, :], other=0.0)
        for l0 in range(start, end, BLOCK_L):
            rl = l0 + tl.arange(0, BLOCK_L)
            l_ok = rl < end
            kt = tl.load(k_ptr + b * skb + kh * skh + rl[None, :] * D + rd[:, None],
                         mask=l_ok[None, :] & d_ok[:, None], other=0.0)
            sc = _mma(q, kt, tl.zeros([BLOCK_H, BLOCK_L], tl.float32), PRECISE) * scale
            if HAS_ALLOWED:
                seen = tl.load(allowed_ptr + b * sab + rl, mask=l_ok, other=0)
                sc = tl.where((seen != 0)[None, :], sc, ATTENTION_FLOOR)
            m_new = tl.maximum(m_i, tl.max(sc, axis=1))
            p = tl.where(l_ok[None, :], tl.exp(sc - m_new[:, None]), 0.0)
            alpha = tl.exp(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            vt = tl.load(v_ptr + b * svb + kh * svh + rl[:, None] * D + rd[None, :],
                         mask=l_ok[:, None] & d_ok[None, :], other=0.0)
            acc = _mma(p.to(vt.dtype), vt, acc * alpha[:, None], PRECISE)
            m_i = m_new
    if PARTIAL:
        row = (s * tl.num_programs(0) + b) * Hq + h  # partials [SPLIT, B, Hq, (D)]
        tl.store(pacc_ptr + row[:, None] * D + rd[None, :], acc, mask=h_in[:, None] & d_ok[None, :])
        tl.store(pm_ptr + row, m_i, mask=h_in)
        tl.store(pl_ptr + row, tl.where(h_ok, l_i, 0.0), mask=h_in)
    else:
        o = tl.where(h_ok[:, None] & (l_i[:, None] > 0), acc / tl.maximum(l_i, 1.0e-30)[:, None], 0.0)
        tl.store(out_ptr + (b * Hq + h)[:, None] * D + rd[None, :], o.to(out_ptr.dtype.element_ty),
                 mask=h_in[:, None] & d_ok[None, :])


@triton.jit
def wide_attention_reduce_kernel(pacc_ptr, pm_ptr, pl_ptr, out_ptr, S, BH, D,
                                 BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    """out[row] = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s over the splits, in split order; a row no
    split summed (a skipped head) is 0; a row allowed no key in any split (every m_s the floor) averages them all."""
    row = tl.program_id(0)
    rs = tl.arange(0, BLOCK_S)
    rd = tl.arange(0, BLOCK_D)
    s_ok = rs < S
    m = tl.load(pm_ptr + rs * BH + row, mask=s_ok, other=ATTENTION_FLOOR)
    l_s = tl.load(pl_ptr + rs * BH + row, mask=s_ok, other=0.0)
    w = tl.where(s_ok, tl.exp(m - tl.max(m, axis=0)), 0.0)
    den = tl.sum(w * l_s, axis=0)
    acc = tl.load(pacc_ptr + (rs[:, None] * BH + row) * D + rd[None, :], mask=s_ok[:, None] & (rd < D)[None, :],
                  other=0.0)
    num = tl.sum(w[:, None] * acc, axis=0)
    o = tl.where(den > 0, num / tl.maximum(den, 1.0e-30), 0.0)
    tl.store(out_ptr + row * D + rd, o.to(out_ptr.dtype.element_ty), mask=rd < D)


@triton.jit
def wide_masked_attention_kernel(q_ptr, k_ptr, v_ptr, allowed_ptr, mask_ptr, out_ptr, T, S, past, Hq, G, D, REP,
                                 sqb, sqh, sqt, skb, skh, svb, svh, sab, sat, sob, soh, sot, scale,
                                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                                 HAS_MASK: tl.constexpr, HAS_ALLOWED: tl.constexpr, CAUSAL: tl.constexpr,
                                 PRECISE: tl.constexpr):
    """Prefill attention, and WideMaskedAttention as the ONNX op states it (reference.wide_masked_attention):
    program (query tile, b * Hq + h) attends BLOCK_M of the T queries (positions past + t) of head h (KV head
    h // REP) to the S keys. HAS_ALLOWED: the keys `allowed` [B, 1, T, S] allows (bytes, 0 = not allowed:
    scored with float32's lowest value, so a row allowed no key gets the mean of v over all S keys, as the
    model's attention gives it); else the keys up to each query's position. CAUSAL: nothing after a query's
    position is allowed, so those keys are not scored; rows allowed nothing still average all S values. A
    (token, head) whose group head_mask [B, T, G] skips is 0, and a tile none of whose tokens keeps h's group
    computes nothing. head_dim contiguous in q, k, v, out; the other axes strided."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // Hq
    h = bh % Hq
    kh = h // REP
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rd = tl.arange(0, BLOCK_D)
    m_ok = rm < T
    d_ok = rd < D
    keep = m_ok
    if HAS_MASK:
        keep = m_ok & (tl.load(mask_ptr + (b * T + rm) * G + h // (Hq // G), mask=m_ok, other=0) != 0)
    active = tl.sum(keep.to(tl.int32), axis=0)
    m_i = tl.full([BLOCK_M], ATTENTION_FLOOR, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    if active > 0:
        q = tl.load(q_ptr + b * sqb + h * sqh + rm[:, None] * sqt + rd[None, :], mask=keep[:, None] & d_ok[None, :],
                    other=0.0)
        hi = S
        if CAUSAL:
            hi = tl.minimum(S, past + (pid_m + 1) * BLOCK_M)  # the tile's last query sees keys up to here
        for n0 in range(0, hi, BLOCK_N):
            rn = n0 + tl.arange(0, BLOCK_N)
            n_ok = rn < S
            kt = tl.load(k_ptr + b * skb + kh * skh + rn[None, :] * D + rd[:, None], mask=n_ok[None, :] & d_ok[:, None],
                         other=0.0)
            sc = _mma(q, kt, tl.zeros([BLOCK_M, BLOCK_N], tl.float32), PRECISE) * scale
            if HAS_ALLOWED:
                ok = tl.load(allowed_ptr + b * sab + rm[:, None] * sat + rn[None, :],
                             mask=m_ok[:, None] & n_ok[None, :], other=0) != 0
            else:
                ok = rn[None, :] <= past + rm[:, None]
            sc = tl.where(ok, sc, ATTENTION_FLOOR)
            m_new = tl.maximum(m_i, tl.max(sc, axis=1))
            p = tl.where(n_ok[None, :], tl.exp(sc - m_new[:, None]), 0.0)
            alpha = tl.exp(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            vt = tl.load(v_ptr + b * svb + kh * svh + rn[:, None] * D + rd[None, :], mask=n_ok[:, None] & d_ok[None, :],
                         other=0.0)
            acc = _mma(p.to(vt.dtype), vt, acc * alpha[:, None], PRECISE)
            m_i = m_new
        if CAUSAL:
            # Kept rows allowed no key so far (m_i never rose above the floor): every key after `hi` is not
            # allowed either, scored the floor like the rest, weight 1 each: their mean of v takes all S keys.
            lonely = keep & (m_i == ATTENTION_FLOOR)
            if tl.sum(lonely.to(tl.int32), axis=0) > 0:
                for n0 in range(tl.cdiv(hi, BLOCK_N) * BLOCK_N, S, BLOCK_N):
                    rn = n0 + tl.arange(0, BLOCK_N)
                    n_ok = rn < S
                    p = tl.where(lonely[:, None] & n_ok[None, :], 1.0, 0.0)
                    l_i = l_i + tl.sum(p, axis=1)
                    vt = tl.load(v_ptr + b * svb + kh * svh + rn[:, None] * D + rd[None, :],
                                 mask=n_ok[:, None] & d_ok[None, :], other=0.0)
                    acc = _mma(p.to(vt.dtype), vt, acc, PRECISE)
    o = tl.where(keep[:, None] & (l_i[:, None] > 0), acc / tl.maximum(l_i, 1.0e-30)[:, None], 0.0)
    tl.store(out_ptr + b * sob + h * soh + rm[:, None] * sot + rd[None, :], o.to(out_ptr.dtype.element_ty),
             mask=m_ok[:, None] & d_ok[None, :])
