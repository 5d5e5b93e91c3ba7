"""policy.json's schema, `bench kernels --record` and the measured policy (per kernel kind, against plain dense)."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from tests.helpers import assert_one_line_error
from wide_export.kernels import policy

GOOD = {"sm_90": {"measured": True, "device": "NVIDIA H200", "dtype": "bf16",
                  "gemv_max_m": {"n": 2, "gated": 4, "k": 1}, "gemv_max_m_shapes": {"k:4096x4096": 2},
                  "grouped_n_min_m": 512, "grouped_n_min_group_size": 128, "grouped_k_min_m": 4096,
                  "grouped_k_min_group_size": 512, "fallback": "dense",
                  "prefill_tiles": {"tile_n": [[0, "small"], [2048, "large"], [8192, "wide"]],
                                    "tile_gated": [[0, "small"], [2048, "large"]], "tile_k": [[0, "small"]],
                                    "grouped_n": [[0, "large"]], "grouped_gated": [[0, "small"], [4096, "large"]]}}}


def test_repository_policy_table_is_valid():
    table = json.loads(policy.POLICY_FILE.read_text())
    assert policy.validate(table) == []
    assert {"default", "interpreter"} <= set(table)


@pytest.mark.parametrize("breakage,needle", [
    (lambda e: e.update(gemv_max_m=2), "gemv_max_m"),                              # the old scalar form
    (lambda e: e["gemv_max_m"].pop("gated"), "gemv_max_m"),
    (lambda e: e.update(grouped_k_min_m=-1), "grouped_k_min_m"),
    (lambda e: e.update(grouped_n_min_m="512"), "grouped_n_min_m"),
    (lambda e: e.update(fallback="cublas"), "fallback"),
    (lambda e: e.pop("prefill_tiles"), "prefill_tiles"),                           # a record without it
    (lambda e: e.update(large_tile_min_m=1024), "prefill_tiles"),                  # the old single switch, alone
    (lambda e: e["prefill_tiles"].pop("tile_k"), "prefill_tiles"),
    (lambda e: e["prefill_tiles"].update(tile_gated=[[0, "small"], [2048, "wide"]]), "tile_gated"),  # no such cubin
    (lambda e: e["prefill_tiles"].update(tile_n=[[1, "small"]]), "tile_n"),        # must start at 0
    (lambda e: e["prefill_tiles"].update(tile_n=[[0, "small"], [0, "large"]]), "tile_n"),      # not ascending
    (lambda e: e["prefill_tiles"].update(tile_n=[[0, "small"], [9, "large"], [5, "wide"]]), "tile_n"),
    (lambda e: e["prefill_tiles"].update(tile_n=[]), "tile_n"),
    (lambda e: e["prefill_tiles"].update(tile_n=[[0, "small"]] + [[i, "large"] for i in range(1, 5)]), "tile_n"),
    (lambda e: e["prefill_tiles"].update(tile_n=[[0, "huge"]]), "tile_n"),
    (lambda e: e["prefill_tiles"].update(tile_n=[[True, "small"]]), "tile_n"),
    (lambda e: e["prefill_tiles"].update(tile_n=[(0, "small")]), "tile_n"),        # JSON has no tuples: still refused
    (lambda e: e.update(measured="yes"), "measured"),
    (lambda e: e.update(gemv_max_m_shapes={"down:4096x14336": 1}), "gemv_max_m_shapes"),
    (lambda e: e.update(gemv_max_m_shapes={"k:4096": 1}), "gemv_max_m_shapes"),
    (lambda e: e.update(gemv_maxm=3), "unknown keys"),
])
def test_validate_names_what_is_wrong(breakage, needle):
    bad = json.loads(json.dumps(GOOD))
    breakage(bad["sm_90"])
    errs = policy.validate(bad)
    assert errs and needle in errs[0]
    assert policy.validate(GOOD) == []


def test_choose_is_per_kind_and_per_shape():
    p = GOOD["sm_90"]
    assert policy.choose("gated", 4, 128, p, 14336, 4096) == "gemv"     # gated up to 4 ...
    assert policy.choose("n", 4, 128, p, 4096, 4096) == "dense"         # ... n only up to 2
    assert policy.choose("k", 2, 128, p, 4096, 14336) == "dense"        # k: 1 ...
    assert policy.choose("k", 2, 128, p, 4096, 4096) == "gemv"          # ... but the o shape's rule says 2
    assert policy.choose("k", 2, 128, p) == "dense"                     # no shape given: the kind's value


@pytest.fixture()
def policy_copy(tmp_path, monkeypatch):
    dest = tmp_path / "policy.json"
    shutil.copy(policy.POLICY_FILE, dest)
    monkeypatch.setattr(policy, "POLICY_FILE", dest)
    policy._table.cache_clear()
    yield dest
    policy._table.cache_clear()


def _record(path):
    from wide_export.cli import app

    return CliRunner().invoke(app, ["bench", "kernels", "--record", str(path)])


def test_record_merges_a_measured_policy(policy_copy, tmp_path):
    before = json.loads(policy_copy.read_text())
    rec = tmp_path / "policy-sm_90.json"
    rec.write_text(json.dumps(GOOD, indent=2))
    res = _record(rec)
    assert res.exit_code == 0, res.output
    after = json.loads(policy_copy.read_text())
    assert after["sm_90"] == after["sm_90@NVIDIA H200"] == GOOD["sm_90"]
    assert {k: v for k, v in after.items() if k not in ("sm_90", "sm_90@NVIDIA H200")} == before  # the rest untouched
    assert policy.validate(after) == []
    assert policy.policy_for("sm_90")["gemv_max_m"] == {"n": 2, "gated": 4, "k": 1}
    # a second GPU model of the architecture: its own entry, and the architecture's now; the first keeps its own
    h100 = dict(GOOD["sm_90"], device="NVIDIA H100 80GB HBM3", gemv_max_m={"n": 1, "gated": 1, "k": 1})
    rec.write_text(json.dumps({"sm_90": h100}))
    from wide_export.bench.kernels import record_policy

    assert record_policy(rec) == "sm_90, sm_90@NVIDIA H100 80GB HBM3"  # the entries it wrote
    assert policy.policy_for("sm_90", "NVIDIA H200")["gemv_max_m"] == {"n": 2, "gated": 4, "k": 1}
    assert policy.policy_for("sm_90", "NVIDIA H100 80GB HBM3")["gemv_max_m"] == {"n": 1, "gated": 1, "k": 1}
    assert policy.policy_for("sm_90", "NVIDIA GH200 480GB")["arch"] == "sm_90"  # no entry of its own
    assert policy.policy_for("sm_90")["gemv_max_m"] == {"n": 1, "gated": 1, "k": 1}
    rec.write_text(json.dumps({"sm_90": dict(h100, device="NVIDIA H100/PCIe")}))  # a name that cannot be a key
    assert record_policy(rec) == "sm_90"


@pytest.mark.parametrize("content", [
    "{not json",
    json.dumps({"sm_90": {**GOOD["sm_90"], "gemv_max_m": 2}}),          # old scalar gemv_max_m
    json.dumps({"sm_90": {**GOOD["sm_90"], "measured": False}}),         # starting values are no record
    json.dumps({"default": GOOD["sm_90"]}),                              # only GPU architectures
    json.dumps({"sm90": GOOD["sm_90"]}),
    json.dumps({}),
    json.dumps([1, 2]),
])
def test_record_refuses_a_malformed_policy_in_one_line(policy_copy, tmp_path, content):
    before = policy_copy.read_bytes()
    rec = tmp_path / "policy-sm_90.json"
    rec.write_text(content)
    res = _record(rec)
    line = assert_one_line_error(res)
    assert str(rec) in line
    assert policy_copy.read_bytes() == before  # nothing written


def test_record_of_a_missing_file_is_one_line(policy_copy, tmp_path):
    assert "no policy record" in assert_one_line_error(_record(tmp_path / "nowhere.json"))


def _row(kernel, N, K, T, gemv_ms, dense_ms=1.0, masked_dense_ms=10.0, gs=128):
    from wide_export.bench.kernels import Row

    times = {"gemv": gemv_ms, "dense": masked_dense_ms}
    return Row(kernel, f"m/{N}x{K}", N, K, gs, 0.5, "random", T, dense_ms, times, "gemv", gemv_ms,
               dense_ms / gemv_ms, 0.5)


def test_measured_policy_is_per_kind_against_plain_dense():
    """Down (k, 4096x14336) loses from T = 2, o (k, 4096x4096) wins to T = 4, gated wins to 4, n to 1:
    gemv_max_m = {n: 1, gated: 4, k: 1} with a rule for o; the masked dense path (10 ms, slower than
    everything) must not be what the GEMV is compared with."""
    from wide_export.bench.kernels import Report, measured_policy

    rows = []
    for T in (1, 2, 4, 8):
        rows.append(_row("n", 4096, 4096, T, 0.5 if T <= 1 else 1.5))
        rows.append(_row("gated", 14336, 4096, T, 0.5 if T <= 4 else 1.5))
        rows.append(_row("k", 4096, 14336, T, 0.5 if T <= 1 else 1.5))
        rows.append(_row("k", 4096, 4096, T, 0.5 if T <= 4 else 1.5))
    pol = measured_policy(Report("H200", "sm_90", "bf16", "short", 4300.0, rows))
    entry = pol["sm_90"]
    assert entry["gemv_max_m"] == {"n": 1, "gated": 4, "k": 1}
    assert entry["gemv_max_m_shapes"] == {"k:4096x4096": 4}
    assert policy.validate(pol) == []


@pytest.mark.parametrize("tile_ms, want", [(0.8, "tile"), (1.2, "dense")])
def test_measured_fallback_is_tile_only_where_it_beat_cublas_plus_the_mask_pass(tile_ms, want):
    """Past the GEMV (T > 1 here) the fused-epilogue tile kernel must beat the masked dense path (1.0 ms) on
    every row for `auto` to fall back to it; one row where it lost (T = 64, 1.2 ms) keeps dense. The
    GEMV's own rows (T = 1, where tile was 5 ms) do not count."""
    from wide_export.bench.kernels import Report, measured_policy

    rows = []
    for T in (1, 16, 64):
        r = _row("n", 4096, 4096, T, 0.5 if T == 1 else 9.0, masked_dense_ms=1.0)
        r.algo_ms["tile"] = 5.0 if T == 1 else (tile_ms if T == 64 else 0.8)
        rows.append(r)
    entry = measured_policy(Report("H200", "sm_90", "bf16", "short", 4300.0, rows))["sm_90"]
    assert entry["gemv_max_m"]["n"] == 1 and entry["fallback"] == want


def _sized_rows(kind, algo, times):
    """Rows of `kind` at each T of `times` ({T: {size: ms}}), timed "<algo>@<size>", two shapes a T."""
    rows = []
    for T, by_size in times.items():
        for N in (4096, 14336):
            r = _row(kind, N, 4096, T, 9.0)
            r.algo_ms.update({f"{algo}@{z}": ms * (2 if N == 14336 else 1) for z, ms in by_size.items()})
            rows.append(r)
    return rows


def test_measured_prefill_tiles_are_the_fastest_size_per_timed_t():
    """Buckets by hand: [0, small] first, then a bucket wherever the fastest size (summed over the T's rows)
    changes; a family no row timed keeps the table's buckets."""
    from wide_export.bench.kernels import Report, measured_policy
    from wide_export.kernels.policy import policy_for

    rows = _sized_rows("n", "tile", {256: {"small": 1.0, "large": 1.1, "wide": 1.2},      # small: no bucket
                                     4096: {"small": 1.0, "large": 0.8, "wide": 0.9},     # large from 4096
                                     16384: {"small": 1.0, "large": 0.8, "wide": 0.7}})   # wide from 16384
    rows += _sized_rows("gated", "grouped", {256: {"small": 1.0, "large": 0.9}, 4096: {"small": 1.0, "large": 0.5}})
    rows += _sized_rows("k", "tile", {256: {"small": 1.0, "large": 0.9, "wide": 1.5},
                                      4096: {"small": 0.7, "large": 0.9, "wide": 1.5}})  # back to small
    # the second shape breaks a tie the first alone would not: summed, large wins (1.0 + 2.0 vs 1.05 + 1.9)
    tie = _sized_rows("gated", "tile", {512: {"small": 1.0, "large": 1.05}})
    tie[1].algo_ms.update({"tile@small": 2.0, "tile@large": 1.9})
    rows += tie
    entry = measured_policy(Report("H200", "sm_90", "bf16", "short", 4300.0, rows))["sm_90"]
    tiles = entry["prefill_tiles"]
    assert tiles["tile_n"] == [[0, "small"], [4096, "large"], [16384, "wide"]]
    assert tiles["grouped_gated"] == [[0, "small"], [256, "large"]]
    assert tiles["tile_k"] == [[0, "small"], [256, "large"], [4096, "small"]]
    assert tiles["tile_gated"] == [[0, "small"], [512, "large"]]
    assert tiles["grouped_n"] == policy_for("sm_90")["prefill_tiles"]["grouped_n"]  # nothing timed it
    assert policy.validate({"sm_90": entry}) == []


def test_measured_prefill_tiles_need_every_size_of_the_family_and_stop_at_the_table_limit():
    from wide_export.bench.kernels import measured_prefill_tiles
    from wide_export.kernels.policy import MAX_TILE_BUCKETS, policy_for

    table = policy_for("sm_90")["prefill_tiles"]
    partial = _sized_rows("n", "tile", {4096: {"small": 1.0, "large": 0.5}})  # no wide timing: not measured
    assert measured_prefill_tiles(partial, table)["tile_n"] == table["tile_n"]
    flip = {T: ({"small": 0.5, "large": 1.0} if i % 2 else {"small": 1.0, "large": 0.5})
            for i, T in enumerate((256, 512, 1024, 2048, 4096, 8192))}
    got = measured_prefill_tiles(_sized_rows("n", "grouped", flip), table)["grouped_n"]
    assert got == [[0, "small"], [256, "large"], [512, "small"], [1024, "large"]] and len(got) == MAX_TILE_BUCKETS


def test_roofline_counts_the_union_of_the_masks_by_hand():
    import torch

    from wide_export.bench.kernels import roofline

    # 2 tokens, 4 groups: token 0 runs groups {0, 1}, token 1 runs {1, 2}; union 3/4; per-token 2/4 + 2/4.
    mask = torch.tensor([[1, 1, 0, 0], [0, 1, 1, 0]], dtype=torch.int32)
    N, K, es = 64, 32, 2
    nbytes, flops = roofline("gated", N, K, 16, mask, es)
    assert nbytes == 3 / 4 * N * K * es * 2 + 2 * (K + N) * es + 2 * 4 * 4
    assert flops == 2 * 1.0 * N * K * 2
    nbytes, flops = roofline("k", N, K, 8, mask, es)
    assert nbytes == 3 / 4 * N * K * es + 2 * (K + N) * es + 2 * 4 * 4 and flops == 2 * N * K


def test_unmeasured_default_runs_k_pruned_prefill_dense_not_the_fp32_scatter_add():
    # the grouped gemm_k (float32 atomics) was predicted to lose to dense on Hopper; until a GPU run
    # records otherwise, the default (what sm_80 / sm_90 fall back to) never picks it, while N-pruned prefill
    # still runs grouped.
    from wide_export.kernels.policy import choose, policy_for

    for arch in ("sm_80", "sm_90"):
        pol = policy_for(arch)
        if pol.get("measured"):
            continue
        for M in (1024, 4096, 16384, 1 << 20):
            assert choose("k", M, 512, pol, 4096, 4096) == "dense"
            assert choose("k", M, 2048, pol, 4096, 14336) == "dense"
        assert choose("gated", 4096, 128, pol, 14336, 4096) == "grouped"


def test_bench_times_every_size_class_of_each_family_on_a_gpu_only():
    """The rows measured_prefill_tiles reads: on a GPU whose arch has the large tiles, from TILE_TUNE_MIN_T
    tokens at TILE_TUNE_GROUP_SIZE, each prefill GEMM at each size its family has (configs.TILE_FAMILIES)."""
    from wide_export.bench.kernels import TILE_TUNE_GROUP_SIZE, TILE_TUNE_MIN_T, _algos_for

    T, gs = TILE_TUNE_MIN_T, TILE_TUNE_GROUP_SIZE
    want = {"n": {"grouped@small", "grouped@large", "tile@small", "tile@large", "tile@wide"},
            "gated": {"grouped@small", "grouped@large", "tile@small", "tile@large"},
            "k": {"tile@small", "tile@large", "tile@wide"}}
    for kind, sized in want.items():
        assert {a for a in _algos_for(kind, T, gs, cuda=True, sizes_ok=True) if "@" in a} == sized, kind
        for args in ((T - 1, gs, True, True), (T, gs, False, True),  # under the T; the interpreter
                     (T, gs, True, False), (T, 32, True, True)):     # e.g. sm_80; another group size
            assert not any("@" in a for a in _algos_for(kind, *args[:3], sizes_ok=args[3])), (kind, args)


@pytest.mark.parametrize("name, block_m, block_n", [("grouped@large", 128, 16), ("grouped@small", 64, 16),
                                                    ("grouped", 64, 16), ("tile@wide", 128, 256),
                                                    ("tile@large", 128, 128), ("tile", 64, 64)])
def test_bench_algo_suffix_forces_the_tile_size(name, block_m, block_n, monkeypatch):
    """"<algo>@<size>" reach the kernels as tiles=...; plain "grouped" / "tile" follow the policy (20 rows:
    under the interpreter's large bucket). Runs the kernel in the interpreter and checks its output."""
    import torch

    from wide_export.bench.kernels import _call
    from wide_export.kernels import launch
    from wide_export.ops import reference as ref

    seen = []
    real = launch._launch
    monkeypatch.setattr(launch, "_launch", lambda k, g, *a, **kw: (seen.append((kw.get("BLOCK_M"), kw.get("BLOCK_N"))),
                                                                  real(k, g, *a, **kw))[1])
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(20, 32, generator=gen).to(torch.bfloat16)
    w = (torch.randn(64, 32, generator=gen) / 6).to(torch.bfloat16)
    m = (torch.rand(20, 4, generator=gen) > 0.5).to(torch.int32)
    got = _call("n", name, x, w, None, m, 16)
    want = ref.masked_gemm_n(x, w, m, 16)
    assert (got.float() - want.float()).abs().max().item() <= 2.5e-2 * max(1.0, want.float().abs().max().item())
    gemms = [b for b in seen if b[1] is not None and b[0] in (64, 128)]  # not group_rows' launch
    assert gemms == [(block_m, block_n)], seen


# -- the policy's rules at their boundaries, and its refusals word for word (hand-written expectations)
HAND = {"measured": False, "gemv_max_m": {"n": 2, "gated": 4, "k": 1}, "gemv_max_m_shapes": {"k:4096x14336": 8},
        "grouped_n_min_m": 100, "grouped_n_min_group_size": 64, "grouped_k_min_m": 200,
        "grouped_k_min_group_size": 128, "fallback": "tile",
        "prefill_tiles": {"tile_n": [[0, "small"], [300, "large"], [5000, "wide"]], "tile_gated": [[0, "small"]],
                          "tile_k": [[0, "wide"], [64, "small"]], "grouped_n": [[0, "small"], [300, "large"]],
                          "grouped_gated": [[0, "small"], [300, "large"]]}}


@pytest.mark.parametrize("kind, M, gs, N, K, want", [
    ("n", 2, 64, None, None, "gemv"), ("n", 3, 64, None, None, "tile"), ("gated", 4, 64, None, None, "gemv"),
    ("k", 1, 128, None, None, "gemv"), ("k", 2, 128, None, None, "tile"),
    ("k", 8, 128, 4096, 14336, "gemv"), ("k", 9, 128, 4096, 14336, "tile"),  # the shape's own rule
    ("k", 8, 128, 4096, None, "tile"),                                      # a rule needs both N and K
    ("k", 200, 128, None, None, "grouped"), ("k", 199, 128, None, None, "tile"),
    ("k", 200, 127, None, None, "tile"),
    ("n", 100, 64, None, None, "grouped"), ("n", 99, 64, None, None, "tile"), ("gated", 100, 64, None, None, "grouped"),
    ("n", 100, 48, None, None, "tile"),     # under the minimum group size
    ("n", 100, 96, None, None, "grouped"),  # 96 = 3 x 32: 32-wide grouped tiles
    ("n", 100, 72, None, None, "tile"),     # no grouped tile divides 72
])
def test_choose_at_each_threshold(kind, M, gs, N, K, want):
    assert policy.choose(kind, M, gs, HAND, N, K) == want


@pytest.mark.parametrize("fam, M, want", [
    ("tile_n", 0, "small"), ("tile_n", 299, "small"), ("tile_n", 300, "large"), ("tile_n", 4999, "large"),
    ("tile_n", 5000, "wide"), ("tile_n", 1 << 30, "wide"), ("tile_gated", 1 << 30, "small"),
    ("tile_k", 63, "wide"), ("tile_k", 64, "small"), ("grouped_n", 300, "large"),
])
def test_tile_size_is_the_last_bucket_from_its_min_m(fam, M, want):
    assert policy.tile_size(fam, M, HAND) == want
    assert policy.validate({"sm_90": HAND}) == []


@pytest.mark.parametrize("fam, size, arch, dtype, aligned, want", [
    ("tile_n", "wide", "sm_90", "bfloat16", True, "wide"),
    ("tile_n", "wide", "sm_90", "bfloat16", False, "large"),  # wide has no unaligned cubin
    ("tile_n", "wide", "sm_80", "float16", True, "small"),    # sm_80: neither wide nor large
    ("tile_n", "wide", "sm_90", "float32", True, "small"),    # float32: the precise path, small only
    ("tile_n", "large", "sm_90", "float16", False, "large"),
    ("tile_k", "wide", "interpreter", "float16", False, "large"),
    ("grouped_gated", "large", "sm_90", "bfloat16", False, "large"),
    ("tile_gated", "small", "sm_90", "bfloat16", True, "small"),
])
def test_size_for_steps_down_to_what_the_call_can_run(fam, size, arch, dtype, aligned, want):
    from wide_export.kernels import configs

    assert configs.size_for(fam, size, arch, dtype, aligned) == want


def test_size_for_refuses_a_size_the_family_lacks():
    from wide_export.kernels import configs

    with pytest.raises(ValueError, match="tile_gated has no 'wide' tiles"):
        configs.size_for("tile_gated", "wide", "sm_90", "bfloat16", True)


def test_policy_for_names_the_entry_it_took(monkeypatch):
    assert policy.policy_for("interpreter")["arch"] == "interpreter"
    assert policy.policy_for("sm_75", "NVIDIA T4")["arch"] == "default"
    table = {"default": GOOD["sm_90"], "sm_90": GOOD["sm_90"], "sm_90@None": GOOD["sm_90"]}  # "None" is a name
    monkeypatch.setattr(policy, "_table", lambda: table)
    assert policy.policy_for("sm_90")["arch"] == "sm_90"  # no device given: never a device's entry
    assert policy.policy_for("sm_90", "None")["arch"] == "sm_90@None"
    assert policy.policy_for("sm_75")["arch"] == "default"  # no entry of its own: the default one
    assert policy.policy_for("sm_75")["fallback"] == json.loads(policy.POLICY_FILE.read_text())["default"]["fallback"]


def test_validate_words_each_refusal():
    entry = GOOD["sm_90"]
    assert policy.validate([]) == ["the policy must be a JSON object keyed by architecture"]
    keys = "'default', 'interpreter', 'sm_<NN>' or 'sm_<NN>@<GPU name>' (letters, digits, spaces, ._()-)"
    assert policy.validate({"_doc": "x", "sm_x0": entry}) == [f"'sm_x0': architecture keys are {keys}"]
    assert policy.validate({"smx90": entry}) == [f"'smx90': architecture keys are {keys}"]
    assert policy.validate({"sm_90@NVIDIA H200": entry, "sm_90@NVIDIA H100 80GB HBM3": entry}) == []
    for bad in ('sm_90@', 'sm_90@"H200"', 'sm_9x@H200', 'default@H200', 'sm_90@' + 'x' * 65, 'sm_90@H200\\n'):
        assert policy.validate({bad: entry}) == [f"{bad!r}: architecture keys are {keys}"], bad
    assert policy.validate({"_doc": "x", "sm_90": "fast"}) == ["sm_90: must be an object, got str"]  # checked after _
    assert policy.validate({"sm_90": dict(entry, grouped_n_min_m=2**31)}) == [
        "sm_90: 'grouped_n_min_m' must be an int >= 0, got 2147483648"]
    assert policy.validate({"sm_90": dict(entry, grouped_n_min_m=2**31 - 1)}) == []
    assert policy.validate({"sm_90": dict(entry, fallback="cublas")}) == [
        "sm_90: 'fallback' must be one of ['dense', 'tile'], got 'cublas'"]
    assert policy.validate({"sm_90": dict(entry, gemv_max_m_shapes=["k:1x1", "k:2x2"])}) == [
        "sm_90: 'gemv_max_m_shapes' must be an object of at most 8 rules"]
    eight = {f"k:{n}x{n}": 1 for n in range(1, 9)}  # the C runtime's table holds 8 rules: 8 are fine
    assert policy.validate({"sm_90": dict(entry, gemv_max_m_shapes=eight)}) == []
    assert policy.validate({"sm_90": dict(entry, gemv_max_m_shapes={**eight, "k:9x9": 1})}) == [
        "sm_90: 'gemv_max_m_shapes' must be an object of at most 8 rules"]
    tiles = dict(entry["prefill_tiles"], tile_gated=[[0, "small"], [64, "wide"]])
    assert policy.validate({"sm_90": dict(entry, prefill_tiles=tiles)}) == [
        "sm_90: prefill_tiles['tile_gated'] must be 1 to 4 [min_m, size] buckets, min_m ascending from 0, size one "
        "of ['small', 'large'], got [[0, 'small'], [64, 'wide']]"]
    four = dict(entry["prefill_tiles"], tile_n=[[0, "small"], [1, "large"], [2, "wide"], [3, "small"]])
    assert policy.validate({"sm_90": dict(entry, prefill_tiles=four)}) == []  # the C table holds 4: 4 are fine
    assert policy.validate({"sm_90": dict(entry, large_tile_min_m=1024)}) == [
        "sm_90: 'large_tile_min_m' is now 'prefill_tiles': per family, [[0, \"small\"], [<that M>, \"large\"]]"]
    # every entry is checked and every error kept, past a bad key and from each entry
    assert policy.validate({"sm_x0": entry, "sm_80": dict(entry, fallback="cublas"),
                            "sm_90": dict(entry, grouped_k_min_m=-1)}) == [
        f"'sm_x0': architecture keys are {keys}",
        "sm_80: 'fallback' must be one of ['dense', 'tile'], got 'cublas'",
        "sm_90: 'grouped_k_min_m' must be an int >= 0, got -1"]


def test_merge_recorded_words_each_refusal_and_keeps_the_tables_own_notes():
    table = {"_doc": "the table's", "default": GOOD["sm_90"]}
    good = dict(GOOD["sm_90"])
    for empty in ({}, {"_doc": "x"}):
        assert policy.merge_recorded(empty, table) == (table, ["the record holds no architecture"])
    assert policy.merge_recorded({"default": good}, table) == (
        table, ["'default': a record sets measured GPU architectures (sm_<NN>) only"])
    assert policy.merge_recorded({"sm_90": dict(good, measured=False)}, table) == (
        table, ['sm_90: a record must be measured ("measured": true)'])
    assert policy.merge_recorded({"_doc": "x", "sm_90": dict(good, measured=False)}, table) == (
        table, ['sm_90: a record must be measured ("measured": true)'])  # checked past a note
    merged, errs = policy.merge_recorded({"_doc": "the record's", "sm_90": good}, table)
    assert errs == [] and merged == {"_doc": "the table's", "default": GOOD["sm_90"], "sm_90": good,
                                     "sm_90@NVIDIA H200": good}  # also the entry of the GPU it was measured on
    for device in (None, 'H200 "SXM"', 7):  # no name, or one that cannot be a key: the architecture's entry only
        rec = {k: v for k, v in good.items() if k != "device"} | ({} if device is None else {"device": device})
        merged, errs = policy.merge_recorded({"sm_90": rec}, table)
        assert errs == [] and set(merged) == {"_doc", "default", "sm_90"}, device
    assert policy.merge_recorded({"sm_90@NVIDIA H200": good}, table) == (
        table, ["'sm_90@NVIDIA H200': a record sets measured GPU architectures (sm_<NN>) only"])
