"""The fuzz loop of tests/cpu/test_ops_fuzz.py, run in a child process (`python -c "from tests.cpu.ops_fuzz import
main; main([...])"`): every wide_cpu op with random shapes (zero-sized dims included), dtypes, group sizes,
layouts and values, each case valid or broken in one way (a group size whose product with the group count wraps,
a negative or zero size, a wrong dtype, device or shape, a tensor not contiguous, an `out` overlapping an input, a
short or full cache, NaN / inf values), on every instruction-set path this CPU has. A valid case must run and
equal the PyTorch reference; a broken one must raise; a case marked `either` (a degenerate shape, a layout the op
may refuse) must raise or equal the reference; `any` (a meta tensor) must only not crash. Each case's line is
printed before it runs, so a crash (the child killed by a signal) names the case."""

from __future__ import annotations

import random
import sys
import time

import torch

from tests.cpu import op_cases
from wide_export.model.modeling import apply_rope, rms_norm
from wide_export.ops import reference as ref

VALID, INVALID, EITHER, ANY = "valid", "invalid", "either", "any"  # ANY: only no crash (a meta tensor: the
# dispatcher may run the op's fake, which computes nothing)
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
OPS = torch.ops.wide_cpu


def _tol(dtype):
    return (1e-4, 1e-4) if dtype == torch.float32 else (3e-2, 3e-2)


class Case:
    """One call: `run()` calls the op and returns what to compare (or None: the op declined); `want()` the
    reference's; `expect` VALID / INVALID / EITHER."""

    def __init__(self, name, expect, run, want=None, dtype=torch.float32, exact=False):
        self.name, self.expect, self.run, self.want, self.dtype, self.exact = name, expect, run, want, dtype, exact


def _randn(r: random.Random, *shape, dtype=torch.float32, scale=1.0):
    g = torch.Generator().manual_seed(r.randrange(2**31))
    return (torch.randn(*shape, generator=g) * scale).to(dtype)


def _noncontig(t: torch.Tensor) -> torch.Tensor:
    """The same values in a layout that is not contiguous (where the shape allows one)."""
    if t.dim() >= 2:
        return t.transpose(-1, -2).contiguous().transpose(-1, -2)
    return torch.stack([t, t], -1)[..., 0]


def _other_dtype(r, t: torch.Tensor) -> torch.Tensor:
    if t.dtype == torch.int32:
        return t.to(r.choice([torch.int64, torch.float32, torch.int16]))
    return t.to(r.choice([d for d in (*DTYPES, torch.float64) if d != t.dtype]))


def _over(t: torch.Tensor, shape, dtype) -> torch.Tensor:
    """A tensor of `shape` / `dtype` whose memory starts one element inside t's (t non-empty, same dtype)."""
    n = 1
    for s in shape:
        n *= s
    buf = torch.empty(t.numel() + n, dtype=dtype)
    buf[:t.numel()].copy_(t.reshape(-1))
    t.set_(buf.untyped_storage(), 0, t.shape)
    return buf[max(0, t.numel() - 1):][:n].view(shape)


# ------------------------------------------------------------------------------------------------------------------
def gemm_case(r: random.Random) -> Case:
    kind = r.choice(["n", "gated", "k", "kt", "packed"])
    dtype = r.choice(DTYPES)
    M, G, gs, other = r.choice([0, 1, 2, 3, 5, 17]), r.choice([0, 1, 2, 3, 4]), r.choice([1, 2, 3, 5, 8]), \
        r.choice([0, 1, 4, 7, 16])
    if kind == "packed":
        other = 16 * r.choice([0, 1, 2])
    N, K = (G * gs, other) if kind in ("n", "gated") else (other, G * gs)
    x, w, wu = _randn(r, M, K, dtype=dtype), _randn(r, N, K, dtype=dtype, scale=0.3), _randn(r, N, K, dtype=dtype)
    mask = torch.randint(0, 2, (M, G), dtype=torch.int32, generator=torch.Generator().manual_seed(r.randrange(99)))
    bias = _randn(r, N, dtype=dtype) if kind != "gated" and r.random() < 0.5 else None
    out = torch.full((M, N), float("nan"), dtype=dtype)
    a = dict(x=x, w=w, mask=mask, gs=gs, bias=bias, out=out, wu=wu)
    width = N if kind in ("n", "gated") else K
    mutation = r.choice(["valid", "valid", "huge_gs", "neg_gs", "zero_gs", "dtype", "noncontig", "alias", "shape",
                         "dims", "meta", "rows"])
    expect = VALID
    if mutation == "huge_gs":  # 4 groups x (2**62 + width / 4): 2**64 + width, which wraps to the width
        if width % 4:
            return gemm_case(r)
        a["mask"], a["gs"], expect = torch.ones(M, 4, dtype=torch.int32), (2**64 + width) // 4, INVALID
    elif mutation in ("neg_gs", "zero_gs"):
        a["gs"], expect = (-gs if mutation == "neg_gs" else 0), INVALID
    elif mutation == "dtype":
        key = r.choice(["x", "w", "mask", "out"] + (["bias"] if bias is not None else []) +
                       (["wu"] if kind == "gated" else []))
        a[key], expect = _other_dtype(r, a[key]), INVALID
    elif mutation == "noncontig":
        key = r.choice(["x", "w", "mask", "out"])
        a[key], expect = _noncontig(a[key]), EITHER
    elif mutation == "alias":
        src = r.choice(["x"] + (["w"] if kind in ("n", "gated", "k") else []) + (["bias"] if bias is not None else []))
        if a[src].numel() == 0 or out.numel() == 0:
            return gemm_case(r)
        a["out"], expect = _over(a[src], (M, N), dtype), INVALID
    elif mutation == "shape":
        key = r.choice(["mask", "out", "x"] + (["bias"] if bias is not None else []))
        t = a[key]
        a[key], expect = torch.zeros(*[s + (i == t.dim() - 1) for i, s in enumerate(t.shape)], dtype=t.dtype), INVALID
        if key == "x":
            expect = EITHER  # K + 1 may still match (a packed w's K, say): refused or right
    elif mutation == "dims":
        key = r.choice(["x", "mask", "out"])
        a[key], expect = a[key].unsqueeze(0), INVALID
    elif mutation == "meta":
        key = r.choice(["x", "w", "mask", "out"])
        a[key], expect = a[key].to("meta"), ANY
    elif mutation == "rows":  # 2**31 rows of nothing
        a.update(x=torch.empty(2**31, 0, dtype=dtype), mask=torch.empty(2**31, 0, dtype=torch.int32),
                 out=torch.empty(2**31, 0, dtype=dtype), w=torch.empty(0, 0, dtype=dtype), bias=None, wu=None)
        expect, kind = EITHER, "n"

    def run():
        x, w, mask, gs, bias, out = a["x"], a["w"], a["mask"], a["gs"], a["bias"], a["out"]
        if kind == "n":
            OPS.gemm_n(x, w, mask, gs, bias, out)
        elif kind == "gated":
            OPS.gated(x, w, a["wu"], mask, gs, out)
        elif kind == "k":
            OPS.gemm_k(x, w, mask, gs, bias, out)
        elif kind == "kt":
            OPS.gemm_kt(x, w.t().contiguous() if w.dim() == 2 else w, mask, gs, bias, out)
        else:
            from wide_export.cpu.ops import pack_k
            OPS.gemm_k(x, pack_k(w, gs) if w.dim() == 2 and gs > 0 and w.is_contiguous() else w, mask, gs, bias, out)
        return out

    def want():
        x, w, mask, gs, bias = a["x"], a["w"], a["mask"], a["gs"], a["bias"]
        if kind == "n":
            return ref.masked_gemm_n(x, w, mask, gs, bias)
        if kind == "gated":
            return ref.masked_gated_mlp(x, w, a["wu"], mask, gs)
        return ref.masked_gemm_k(x, w, mask, gs, bias)

    return Case(f"{kind} {mutation} M{M} G{G} gs{gs} other{other} {str(dtype)[6:]}", expect, run, want, dtype)


def rms_norm_case(r: random.Random) -> Case:
    dtype = r.choice(DTYPES)
    lead = [r.choice([0, 1, 2, 3]) for _ in range(r.choice([0, 1, 2]))]
    H = r.choice([0, 1, 7, 16, 33])
    x, w = _randn(r, *lead, H, dtype=dtype), 1 + _randn(r, H, dtype=dtype, scale=0.1)
    a = dict(x=x, w=w, out=torch.full_like(x, float("nan")))
    mutation = r.choice(["valid", "valid", "dtype", "noncontig", "alias", "shape", "scalar", "meta"])
    expect = VALID
    if mutation == "dtype":
        key = r.choice(["x", "w", "out"])
        a[key], expect = _other_dtype(r, a[key]), INVALID
    elif mutation == "noncontig":
        key = r.choice(["x", "out"])
        a[key], expect = _noncontig(a[key]), EITHER
    elif mutation == "alias":
        if x.numel() == 0:
            return rms_norm_case(r)
        a["out"], expect = _over(a["x"], tuple(x.shape), dtype), INVALID
    elif mutation == "shape":
        a["w"], expect = torch.ones(H + 1, dtype=dtype), INVALID
    elif mutation == "scalar":
        a["x"], a["out"], expect = torch.tensor(1.0, dtype=dtype), torch.tensor(1.0, dtype=dtype), INVALID
    elif mutation == "meta":
        key = r.choice(["x", "w", "out"])
        a[key], expect = a[key].to("meta"), ANY

    def run():
        return a["out"] if OPS.rms_norm(a["x"], a["w"], 1e-6, a["out"]) else None

    return Case(f"rms_norm {mutation} {list(x.shape)} {str(dtype)[6:]}", expect, run,
                lambda: rms_norm(a["x"], a["w"], 1e-6), dtype)


def rope_case(r: random.Random) -> Case:
    dtype = r.choice(DTYPES)
    M, H, D = r.choice([0, 1, 2, 3]), r.choice([0, 1, 3]), r.choice([0, 2, 4, 8, 18, 64])
    x, ang = _randn(r, M, H, D, dtype=dtype), _randn(r, M, D, scale=3.0)
    a = dict(x=x, cos=ang.cos().to(dtype), sin=ang.sin().to(dtype))
    mutation = r.choice(["valid", "valid", "odd", "wide", "dtype", "noncontig", "alias", "shape", "flat"])
    expect = VALID
    if mutation == "odd":
        a["x"], a["cos"], a["sin"], expect = _randn(r, M, H, 5, dtype=dtype), torch.ones(M, 5, dtype=dtype), \
            torch.ones(M, 5, dtype=dtype), INVALID
    elif mutation == "wide":
        a["x"], a["cos"], a["sin"], expect = torch.ones(1, 1, 1026, dtype=dtype), torch.ones(1, 1026, dtype=dtype), \
            torch.ones(1, 1026, dtype=dtype), INVALID
    elif mutation == "dtype":
        key = r.choice(["x", "cos", "sin"])
        a[key], expect = _other_dtype(r, a[key]), INVALID
    elif mutation == "noncontig":
        key = r.choice(["x", "cos"])
        a[key], expect = _noncontig(a[key]), EITHER
    elif mutation == "alias":
        if x.numel() == 0 or M * D == 0:
            return rope_case(r)
        a["cos"], expect = _over(a["x"], (M, D), dtype), INVALID
    elif mutation == "shape":
        a["sin"], expect = torch.ones(M + 1, D, dtype=dtype), (INVALID if D else ANY)  # D 0: nothing read
    elif mutation == "flat":
        a["x"], expect = a["x"].reshape(-1), INVALID
    before = a["x"].clone() if a["x"].device.type == "cpu" else None

    def run():
        return a["x"] if OPS.rope(a["x"], a["cos"], a["sin"]) else None

    def want():
        return apply_rope(before, a["cos"][:, None], a["sin"][:, None])

    return Case(f"rope {mutation} M{M} H{H} D{D} {str(dtype)[6:]}", expect, run, want, dtype)


def attention_case(r: random.Random) -> Case:
    dtype = r.choice(DTYPES)
    B, Hk, rep, D, cap = r.choice([0, 1, 2]), r.choice([1, 2]), r.choice([1, 2, 4]), r.choice([0, 8, 16, 12, 24]), \
        r.choice([1, 3, 17, 20])
    Hq, length = Hk * rep, r.randint(1, cap)
    q, k, v = _randn(r, B, Hq, D, dtype=dtype), _randn(r, B, Hk, cap, D, dtype=dtype), _randn(r, B, Hk, cap, D,
                                                                                             dtype=dtype)
    gh = r.choice([1, rep])
    head_mask = torch.randint(0, 2, (B, Hq // gh), dtype=torch.int32) if r.random() < 0.5 else None
    a = dict(q=q, k=k, v=v, length=length, mask=head_mask, gh=gh, out=torch.full_like(q, float("nan")))
    mutation = r.choice(["valid", "valid", "nan", "inf", "view", "long", "zero_len", "rows", "alias", "mask",
                         "heads", "wide", "dtype", "short_v"])
    expect = VALID
    if mutation == "nan" and k.numel():
        k[r.randrange(B), r.randrange(Hk), r.randrange(length), r.randrange(D)] = float("nan")
    elif mutation == "inf" and q.numel():
        q[r.randrange(B), r.randrange(Hq), r.randrange(D)] = r.choice([float("inf"), float("-inf")])
    elif mutation == "view":  # a view of a longer preallocated cache
        a["k"], a["v"] = torch.cat([k, k], 2)[:, :, :cap], torch.cat([v, v], 2)[:, :, :cap]
    elif mutation == "long":
        a["length"], expect = cap + 1, INVALID
    elif mutation == "zero_len":
        a["length"], expect = r.choice([0, -1, -2**62]), INVALID
    elif mutation == "rows":  # rows not D apart
        a["k"], expect = torch.cat([k, k], -1)[..., :D], EITHER
    elif mutation == "alias":
        if q.numel() == 0:
            return attention_case(r)
        a["out"], expect = _over(q, tuple(q.shape), dtype), INVALID
    elif mutation == "mask":
        a["mask"], a["gh"], expect = torch.ones(B * (Hq // gh) + 1, dtype=torch.int32), gh, INVALID
    elif mutation == "heads":
        a["q"], a["out"], expect = _randn(r, B, Hq + 1, D, dtype=dtype), torch.empty(B, Hq + 1, D, dtype=dtype), \
            (INVALID if Hk > 1 else VALID)
        a["mask"] = None
    elif mutation == "wide":
        a.update(q=torch.zeros(1, 1, 520, dtype=dtype), k=torch.zeros(1, 1, 2, 520, dtype=dtype),
                 v=torch.zeros(1, 1, 2, 520, dtype=dtype), out=torch.zeros(1, 1, 520, dtype=dtype), mask=None,
                 length=2)
        expect = INVALID
    elif mutation == "dtype":
        key = r.choice(["k", "v", "out"] + (["mask"] if head_mask is not None else []))
        a[key], expect = _other_dtype(r, a[key]), INVALID
    elif mutation == "short_v":
        a["v"], expect = v[:, :, :length - 1], INVALID

    def run():
        ok = OPS.decode_attention(a["q"], a["k"], a["v"], a["length"], a["mask"], a["gh"], a["out"])
        return a["out"] if ok else None

    def want():
        n = a["length"]
        if a["out"].numel() == 0:  # (the reference's D ** -0.5 divides by zero where D is 0)
            return torch.empty_like(a["out"])
        want = ref.masked_attention(a["q"][:, :, None], a["k"][:, :, :n], a["v"][:, :, :n])[:, :, 0]
        if a["mask"] is None:
            return want
        # a skipped head's output is exactly 0, its inputs not read (the reference's product with the mask turns
        # a NaN there into NaN)
        keep = a["mask"].reshape(B, -1).bool().repeat_interleave(a["gh"], -1)[..., None]
        return torch.where(keep, want, torch.zeros((), dtype=want.dtype))

    return Case(f"attention {mutation} B{B} Hq{Hq} Hk{Hk} D{D} cap{cap} len{length} {str(dtype)[6:]}", expect, run,
                want, dtype)


def router_case(r: random.Random) -> Case:
    dtype = r.choice(DTYPES)
    M, H, R, G = r.choice([0, 1, 3]), r.choice([0, 1, 8]), r.choice([0, 2, 5]), r.choice([0, 1, 3])
    a = dict(h=_randn(r, M, H, dtype=dtype), wc=_randn(r, R, H), bc=_randn(r, R), wr=_randn(r, 2 * G, R),
             br=_randn(r, 2 * G), mask=torch.full((M, G), 7, dtype=torch.int32))
    mutation = r.choice(["valid", "valid", "odd", "dtype", "shape", "alias", "noncontig"])
    expect = VALID
    if mutation == "odd":
        a["wr"], a["br"], expect = _randn(r, 2 * G + 1, R), _randn(r, 2 * G + 1), INVALID
    elif mutation == "dtype":
        key = r.choice(["wc", "bc", "wr", "br", "mask"])
        a[key], expect = _other_dtype(r, a[key]), INVALID
    elif mutation == "shape":
        a["mask"], expect = torch.zeros(M + 1, G, dtype=torch.int32), (INVALID if G else ANY)
    elif mutation == "alias":
        if M * G == 0 or R * H < M * G:
            return router_case(r)
        a["mask"], expect = a["wc"].view(torch.int32).view(-1)[:M * G].view(M, G), INVALID
    elif mutation == "noncontig":
        key = r.choice(["h", "wc", "wr"])
        a[key], expect = _noncontig(a[key]), EITHER

    def run():
        OPS.router(a["h"], a["wc"], a["bc"], a["wr"], a["br"], a["mask"])
        return a["mask"]

    def want():
        logits = ref.router_logits(a["h"], a["wc"], a["bc"], a["wr"], a["br"])
        return ref.wide_router(a["h"], a["wc"], a["bc"], a["wr"], a["br"]), logits

    return Case(f"router {mutation} M{M} H{H} R{R} G{G} {str(dtype)[6:]}", expect, run, want, dtype, exact=True)


def step_case(r: random.Random) -> Case:
    B, (Hq, Hk), D = r.choice([1, 2, 3]), r.choice([(2, 1), (4, 2), (2, 2)]), r.choice([8, 16])
    cap = r.choice([3, 4, 6])
    a = op_cases.step_args(B=B, H=r.choice([16, 24]), Hq=Hq, Hk=Hk, D=D, F_=r.choice([8, 24]), V=r.choice([5, 10]),
                           cap=cap, length=r.randrange(cap), seed=r.randrange(2**31))
    length = a["length"]
    mutation = r.choice(["valid", "valid", "short_v", "full", "neg_len", "zero_h", "same_cache", "out_over_h",
                         "huge_heads", "neg_group", "weight_dtype", "cache_dtype", "cos", "few_weights", "expanded",
                         "meta_cache", "unknown_weight", "router_unrouted", "weight_shape", "transposed_o"])
    expect = VALID
    ck = a["cache_k"][0]
    w, geo = a["weights"], a["geometry"]
    required = sorted(n for n in w if not n.endswith(".bias"))
    if mutation == "short_v":  # the key cache's strides, fewer positions: the row `length` is past its end
        a["cache_v"], expect = [torch.randn(ck.numel()).as_strided((B, Hk, length, D), ck.stride())], INVALID
    elif mutation == "full":
        a["length"], expect = cap, INVALID
    elif mutation == "neg_len":
        a["length"], expect = r.choice([-1, -2**40]), INVALID
    elif mutation == "zero_h":
        a["h"], expect = torch.randn(B, 1, 0), INVALID
    elif mutation == "same_cache":
        a["cache_v"], expect = [ck], INVALID
    elif mutation == "out_over_h":
        a["out"], expect = _over(a["h"], tuple(a["out"].shape), torch.float32), INVALID
    elif mutation == "huge_heads":  # (2**61 + Hq) x 8 heads' width wraps to Hq x 8
        geo["heads"], expect = 2**64 // D + Hq, INVALID
    elif mutation == "neg_group":
        geo[r.choice(["attention_group_heads", "ffn_group_size"])], expect = -Hq, INVALID
    elif mutation == "weight_dtype":
        name = r.choice(required)
        w[name], expect = w[name].double(), INVALID
    elif mutation == "cache_dtype":
        a["cache_k"], expect = [ck.half()], INVALID
    elif mutation == "cos":
        a["cos"], expect = a["cos"][:, :-1].contiguous(), INVALID
    elif mutation == "few_weights":  # a required weight left out
        del w[r.choice(required)]
        expect = INVALID
    elif mutation == "unknown_weight":  # a name the op does not take
        w[r.choice(["self_attn.x_proj.weight", "mlp.gate_proj", "", "input_layernorm.weight "])], expect = \
            torch.ones(1), INVALID
    elif mutation == "router_unrouted":  # a router's weight for a sublayer that is not routed
        w[r.choice(["router_attention.compressor.weight", "router_ffn.router.bias"])], expect = torch.ones(1), INVALID
    elif mutation == "weight_shape":
        name = r.choice(required)
        w[name], expect = w[name][..., :-1].contiguous(), INVALID
    elif mutation == "transposed_o":  # an unrouted o_proj must be [H, NQ] contiguous, not the view of W^T
        w["self_attn.o_proj.weight"], expect = w["self_attn.o_proj.weight"].t().contiguous().t(), INVALID
    elif mutation == "expanded":
        a["cache_v"], expect = [a["cache_v"][0][:, :1].expand(B, Hk, cap, D)], (INVALID if Hk > 1 else VALID)
    elif mutation == "meta_cache":
        a["cache_v"], expect = [a["cache_v"][0].to("meta")], ANY
    base = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in a.items()} if expect != INVALID else None
    if base is not None:
        base["cache_k"], base["cache_v"] = [a["cache_k"][0].clone()], [a["cache_v"][0].clone()]
        base["weights"] = dict(w)

    def run():
        if not op_cases.call_step(a):
            return None
        n = a["length"]
        return torch.cat([a["out"].flatten(), a["cache_k"][0][:, :, n].flatten(), a["cache_v"][0][:, :, n].flatten()])

    def want():
        logits, k, v = op_cases.step_reference(base)
        return torch.cat([logits.flatten(), k.flatten(), v.flatten()])

    return Case(f"decode_step {mutation} B{B} Hq{Hq} Hk{Hk} D{D} cap{cap} len{length}", expect, run, want)


MAKERS = [gemm_case] * 5 + [rms_norm_case, rope_case, attention_case, attention_case, router_case, step_case,
                            step_case]


def _compare(case: Case, got) -> str | None:
    try:
        want = case.want()
    except Exception as err:  # noqa: BLE001 - the reference refuses what the op ran
        return f"the op returned but the reference raised {type(err).__name__}: {err}"
    if got.shape != want[0].shape if case.exact else got.shape != want.shape:
        return f"shape {list(got.shape)}, the reference's {list((want[0] if case.exact else want).shape)}"
    if case.exact:  # the router: the same mask, but where the two logits (nearly) tie
        want, logits = want
        differ = got != want
        near = (logits[..., 0] - logits[..., 1]).abs() <= 1e-4 * (1 + logits.abs().amax(-1))
        return None if not (differ & ~near).any() else f"mask {got.tolist()} != {want.tolist()}"
    rtol, atol = _tol(case.dtype)
    try:
        torch.testing.assert_close(got.float(), want.float(), rtol=rtol, atol=atol, equal_nan=True)
    except AssertionError as err:
        return str(err).splitlines()[0] + " " + " ".join(str(err).splitlines()[1:4])
    return None


def run_case(case: Case) -> str | None:
    """None when the op behaved (ran and matched, or raised, as `expect` allows), else what went wrong."""
    try:
        got = case.run()
    except (RuntimeError, ValueError, IndexError, TypeError, NotImplementedError) as err:
        if case.expect == VALID:
            return f"a valid call was refused: {type(err).__name__}: {str(err).splitlines()[0]}"
        return None
    if case.expect == ANY:
        return None
    if case.expect == INVALID:
        return "a broken call was not refused"
    if got is None:  # the op declined (this instruction set, this head size): nothing to compare
        return None
    return _compare(case, got)


def main(seeds, budget_s: float = 90.0) -> None:
    """Every seed's cases on every instruction set this CPU runs; exit 1 naming each failure (0: none)."""
    isas = ["avx512bf16", "avx512", "avx2", "scalar"]
    best = OPS.isa().split(" ")[0]
    here = isas[isas.index(best):]
    start, failures, counts = time.monotonic(), [], {VALID: 0, INVALID: 0, EITHER: 0, ANY: 0}
    for seed in seeds:
        r = random.Random(seed)
        for i in range(60):
            if time.monotonic() - start > budget_s:
                break
            isa = r.choice(here)
            OPS.set_isa(isa)
            case = MAKERS[r.randrange(len(MAKERS))](r)
            print(f"case seed={seed} #{i} {isa}: {case.name} ({case.expect})", flush=True)
            why = run_case(case)
            counts[case.expect] += 1
            if why:
                failures.append(f"seed={seed} #{i} {isa}: {case.name}: {why}")
    OPS.set_isa(best)
    print(f"ran {sum(counts.values())} cases {counts} in {time.monotonic() - start:.1f} s", flush=True)
    for line in failures:
        print("FAIL", line, flush=True)
    sys.exit(1 if failures else 0)
