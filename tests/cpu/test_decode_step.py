"""A decode step in one call (wide_cpu::decode_step through cpu/step.py): the same logits and KV cache as the
model run op by op through the same kernels (bit for bit where every sublayer is routed), close to the PyTorch
reference with no kernels at all (another code path: torch's GEMMs, the tuple cache), and declined (nothing
written) wherever it does not serve. Fresh random checkpoints of three architectures, every dtype, one and three
rows, the dense flag."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.helpers import make_checkpoint
from wide_export.checkpoint import load_wide_model
from wide_export.model.methods import CpuKernelsMethod, ReferenceMethod

cpu = pytest.importorskip("wide_export.cpu.ops")
pytestmark = pytest.mark.skipif(not cpu.available(), reason="no C++ compiler: the CPU kernels are not built")
ISAS = ["avx512bf16", "avx512", "avx2"]  # the instruction sets the step's attention runs on
BEST = torch.ops.wide_cpu.isa().split(" ")[0] if cpu.available() else "scalar"
VECTOR_HERE = ISAS[ISAS.index(BEST):] if BEST in ISAS else []
needs_vector = pytest.mark.skipif(not VECTOR_HERE, reason="the fused step's attention needs AVX-512 or AVX2; "
                                                          "declined on this CPU")


@pytest.fixture()
def isa(request):
    before = torch.ops.wide_cpu.set_isa(request.param)
    yield request.param
    torch.ops.wide_cpu.set_isa(before)


SPECS = {  # every sublayer routed, with q / k / v / o biases; Qwen3's q / k norms; an unrouted FFN
    "llama": dict(arch="llama", attention_bias=True, num_heads=8, num_kv_heads=2, hidden_size=128,
                  intermediate_size=192, attn_groups=4, ffn_groups=12),
    "qwen3": dict(arch="qwen3", hidden_size=96, num_heads=4, num_kv_heads=2, head_dim=32, attn_groups=2,
                  intermediate_size=192, ffn_groups=12),
    "mistral": dict(arch="mistral", sparse_target="attention", hidden_size=128, num_heads=8, num_kv_heads=4,
                    attn_groups=2),
}
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
PROMPT = 9


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("decode-step")
    return {arch: make_checkpoint(root / arch, num_layers=3, seed=11 + i, **spec)
            for i, (arch, spec) in enumerate(SPECS.items())}


def _model(ckpt, dtype, dense=False):
    model = load_wide_model(ckpt, dtype=str(dtype)[6:], checksums=False).model.eval()
    model.set_force_execute(dense)
    model.use_method(CpuKernelsMethod())
    return model


def _prefilled(model, batch: int, seed: int):
    """Prompt ids, a static cache holding the prompt (the op-by-op prefill) and the next ids."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 250, (batch, PROMPT), generator=gen)
    past = model.static_cache(batch, PROMPT + 4)
    with torch.no_grad():
        model(ids, torch.ones_like(ids), torch.arange(PROMPT).expand(batch, -1), past)
    return ids, past, torch.randint(3, 250, (batch, 1), generator=gen)


def _step(model, past, nxt, fused: bool, monkeypatch):
    """One decode step with the CPU kernels' method, fused or op by op (fused_step=False); (logits, whether the
    fused op served). The rows the fused op takes are held at its own limit (16), not this CPU model's policy
    entry (test_max_rows...)."""
    from wide_export.cpu import step

    batch = nxt.shape[0]
    served = []
    real = step.decode_step
    monkeypatch.setattr(step, "_max_rows", lambda dtype: step.MAX_ROWS)

    def spy(*args):
        out = real(*args)
        served.append(out is not None)
        return out

    before = model.method
    with monkeypatch.context() as m:
        m.setattr(step, "decode_step", spy)
        model.use_method(CpuKernelsMethod(fused_step=fused))
        try:
            with torch.no_grad():
                logits, _ = model(nxt, torch.ones(batch, PROMPT + 1, dtype=torch.long),
                                  torch.full((batch, 1), PROMPT), past)
        finally:
            model.use_method(before)
    return logits, any(served)


def _reference(model, ids):
    """The logits and presents of the PyTorch reference with no kernels (torch's GEMMs, the tuple cache, the
    reference's routers) over `ids`, from the same model (its W^T weights read as their [N, K] views)."""
    before = model.method
    model.use_method(ReferenceMethod())
    try:
        with torch.no_grad():
            return model(ids, torch.ones_like(ids), torch.arange(ids.shape[1]).expand(ids.shape[0], -1),
                         model.empty_cache(ids.shape[0]))
    finally:
        model.use_method(before)


@needs_vector
@pytest.mark.parametrize("isa", VECTOR_HERE, indirect=True)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("batch", [1, 3])
def test_the_fused_step_equals_the_op_by_op_step_bit_for_bit(checkpoints, monkeypatch, isa, arch, dtype, batch):
    """Every sublayer routed: the per-op path runs the same kernels (the policy held to the masked kernel, as
    the fused op always takes it) with the same roundings, so logits and cache are equal, not close; on every
    instruction set this CPU has that the step runs on."""
    model = _model(checkpoints[arch], dtype)
    _, past, nxt = _prefilled(model, batch, seed=batch)
    twin = copy.deepcopy(past)
    monkeypatch.setattr(cpu, "choose", lambda *a: "masked")
    got, served = _step(model, past, nxt, True, monkeypatch)
    want, _ = _step(model, twin, nxt, False, monkeypatch)
    assert served, "the fused op did not serve the decode step"
    assert got.dtype == torch.float32 and got.shape == (batch, 1, model.config.vocab_size)
    assert torch.equal(got, want)
    for a, b in zip(past, twin):
        assert a.length == b.length == PROMPT + 1
        assert torch.equal(a.k[:, :, :a.length], b.k[:, :, :b.length])
        assert torch.equal(a.v[:, :, :a.length], b.v[:, :, :b.length])


def _tolerance(dtype):
    return {torch.float32: 2e-4, torch.bfloat16: 1e-1, torch.float16: 2e-2}[dtype]  # of the largest logit


@needs_vector
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("arch", sorted(SPECS))
@pytest.mark.parametrize("dense", [False, True])
def test_the_fused_step_is_close_to_the_reference(checkpoints, monkeypatch, arch, dtype, dense):
    """Against the PyTorch reference with no kernels (torch's GEMMs, the tuple cache, the reference's routers):
    the logits of one decode step after the same prompt, and the routers took the same decisions (the dense
    flag: every group executes; an unrouted FFN runs dense)."""
    model = _model(checkpoints[arch], dtype, dense)
    ids, past, nxt = _prefilled(model, 2, seed=7)
    got, served = _step(model, past, nxt, True, monkeypatch)
    assert served
    want, _ = _reference(model, torch.cat([ids, nxt], 1))
    tol = _tolerance(dtype)
    scale = want[:, -1:].abs().max()
    torch.testing.assert_close(got, want[:, -1:], rtol=0, atol=float(tol * scale))


@needs_vector
def test_the_fused_step_writes_the_cache_as_the_reference_fills_it(checkpoints, monkeypatch):
    """The keys and values the step adds at the prompt's end equal those a reference forward over prompt + token
    holds there (float32: torch's GEMMs in another order, so close)."""
    model = _model(checkpoints["llama"], torch.float32)
    ids, past, nxt = _prefilled(model, 1, seed=3)
    _step(model, past, nxt, True, monkeypatch)
    _, presents = _reference(model, torch.cat([ids, nxt], 1))
    for mine, (k, v) in zip(past, presents):
        torch.testing.assert_close(mine.k[:, :, PROMPT], k[:, :, PROMPT], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(mine.v[:, :, PROMPT], v[:, :, PROMPT], rtol=1e-5, atol=1e-5)


def _declines(model, h, cos, sin, mask, past) -> bool:
    from wide_export.cpu.step import decode_step

    before = [(p.length, p.k.clone(), p.v.clone()) for p in past] if hasattr(past[0], "length") else None
    with torch.no_grad():
        out = decode_step(model, h, cos, sin, mask, past)
    if before is not None:
        for (n, k, v), p in zip(before, past):
            assert p.length == n and torch.equal(p.k, k) and torch.equal(p.v, v), "a declined step wrote the cache"
    return out is None


def test_what_the_fused_step_does_not_serve_is_declined_untouched(checkpoints):
    model = _model(checkpoints["llama"], torch.float32)
    c = model.config
    _, past, _ = _prefilled(model, 2, seed=5)
    h = torch.randn(2, 1, c.hidden_size)
    cos = sin = torch.ones(2, 1, 1, c.head_dim)
    ones = torch.ones(2, PROMPT + 1, dtype=torch.long)
    padded = ones.clone()
    padded[0, 0] = 0
    assert _declines(model, h, cos, sin, padded, past)  # left padding: the op attends to every position
    assert _declines(model, torch.randn(2, 3, c.hidden_size), cos, sin, ones, past)  # a prefill
    assert _declines(model, h, cos, sin, ones, model.empty_cache(2))  # the tuple cache
    assert _declines(model, h.half(), cos, sin, ones, past)  # another dtype than the weights'
    model.model.layers[1].shard = object()
    assert _declines(model, h, cos, sin, ones, past)  # a tensor-parallel shard
    model.model.layers[1].shard = None
    big = model.static_cache(17, 12)
    assert _declines(model, torch.randn(17, 1, c.hidden_size), torch.ones(17, 1, 1, c.head_dim),
                     torch.ones(17, 1, 1, c.head_dim), torch.ones(17, 1, dtype=torch.long), big)  # too many rows
    full = model.static_cache(2, PROMPT)
    for p in full:
        p.length = PROMPT
    assert _declines(model, h, cos, sin, ones, full)  # no room left in the cache
    before = torch.ops.wide_cpu.set_isa("scalar")
    try:
        assert _declines(model, h, cos, sin, ones, past)  # neither AVX-512 nor AVX2: declined, nothing written
    finally:
        torch.ops.wide_cpu.set_isa(before)


def test_a_weight_replaced_after_a_step_is_read_anew(checkpoints, monkeypatch):
    """The plan of weights is kept between steps; assigning a new parameter anywhere makes it be built again."""
    from wide_export.cpu.step import decode_step

    model = _model(checkpoints["llama"], torch.float32)
    _, past, nxt = _prefilled(model, 1, seed=2)
    twin = copy.deepcopy(past)
    h = model.model.embed_tokens(nxt)
    cos = sin = torch.ones(1, 1, 1, model.config.head_dim)
    mask = torch.ones(1, PROMPT + 1, dtype=torch.long)
    with torch.no_grad():
        first = decode_step(model, h, cos, sin, mask, past)
        if first is None:
            pytest.skip("the fused step declines on this CPU (neither AVX-512 nor AVX2)")
        for layer in model.model.layers:  # every layer's FFN input norm (a random router may skip a sublayer)
            norm = layer.post_attention_layernorm
            norm.weight = torch.nn.Parameter(norm.weight * 3)
        second = decode_step(model, h, cos, sin, mask, twin)
    assert not torch.equal(first, second)


def test_a_bad_weight_is_refused_not_read(checkpoints):
    """The op checks every weight's shape and dtype itself, by name (a caller other than cpu/step.py), before it
    writes anything."""
    from wide_export.cpu import step

    model = _model(checkpoints["llama"], torch.float32)
    _, past, _ = _prefilled(model, 1, seed=4)
    layers = model.model.layers
    named = [step.layer_weights(layer) for layer in layers]
    named[1]["self_attn.q_proj.weight"] = named[1]["self_attn.q_proj.weight"][:-1]  # q_proj one row short
    made = [torch.classes.wide_cpu.DecodeLayer(w, step.layer_geometry(layer)) for w, layer in zip(named, layers)]
    h = torch.randn(1, 1, model.config.hidden_size)
    c = torch.ones(1, model.config.head_dim)
    before = [p.k.clone() for p in past]
    with pytest.raises(RuntimeError, match="layer 1's self_attn.q_proj.weight must be "):
        torch.ops.wide_cpu.decode_step(h, made, [0] * len(made), [p.k for p in past], [p.v for p in past], PROMPT, c,
                                       c, 1e-6, model.model.norm.weight, model.lm_head.weight,
                                       torch.empty(1, 1, model.config.vocab_size))
    assert all(torch.equal(p.k, k) for p, k in zip(past, before))


def test_the_python_table_names_what_the_op_takes(checkpoints):
    """cpu/step.py's one table of a layer's weights (and its geometry ints) names exactly what the op takes, and
    a model's layer gives every required one (its optional ones where it has them: llama's biases)."""
    from wide_export.cpu import step

    weights, geometry = torch.ops.wide_cpu.decode_step_names()
    assert [w.name for w in step.LAYER_WEIGHTS] == list(weights)
    assert list(step.LAYER_GEOMETRY) == list(geometry)
    layer = _model(checkpoints["llama"], torch.float32).model.layers[0]
    named = step.layer_weights(layer)
    assert {w.name for w in step.LAYER_WEIGHTS if not w.optional} <= set(named)
    assert "self_attn.q_proj.bias" in named and "self_attn.q_norm.weight" not in named
    assert set(step.layer_geometry(layer)) == set(geometry)


def test_max_rows_follow_the_policy_of_this_cpu_model(monkeypatch):
    """The fused step takes at most the rows the policy gives every masked kernel (n, gated, k), and 16."""
    from wide_export.cpu import step

    entry = {"masked_max_m": {"n": 8, "gated": 6, "k": 3}, "dense_union_min": 0.95}
    monkeypatch.setattr(step, "policy", lambda dtype: entry)
    assert step._max_rows(torch.float16) == 3
    entry["masked_max_m"] = {"n": 64, "gated": 64, "k": 32}
    assert step._max_rows(torch.bfloat16) == step.MAX_ROWS == 16
