"""The decoder's method objects (model/methods.py): which method computes is the model's own, chosen when it is
built or prepared (use_method), not a process-wide mode: a model with the reference method never calls
wide_export.cpu, on CPU tensors too, even while another model in the process runs the CPU kernels; the CPU
method lays the K-pruned weights out as W^T once (preparing again leaves that one layout, the values unchanged);
the export traces with the reference method and gives the model its own back."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import make_checkpoint
from wide_export.checkpoint import load_wide_model
from wide_export.model.methods import REFERENCE, CpuKernelsMethod, ReferenceMethod
from wide_export.model.modeling import Collector

cpu = pytest.importorskip("wide_export.cpu.ops")
needs_kernels = pytest.mark.skipif(not cpu.available(), reason="no C++ compiler: the CPU kernels are not built")
# every function of wide_export.cpu a method may call (and what they call)
CPU_FUNCTIONS = ("masked_gemm_n", "masked_gated_mlp", "masked_gemm_k", "masked_gemm_kt", "dense_linear", "router",
                 "rms_norm", "rope_", "decode_attention", "run_op", "available", "policy", "choose")
SPEC = dict(arch="qwen3", hidden_size=96, num_heads=4, num_kv_heads=2, head_dim=32, attn_groups=2,
            intermediate_size=192, ffn_groups=12, seed=5)  # q / k norms, both sublayers routed


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("methods") / "ck", num_layers=2, **SPEC)


def _forbid_cpu(monkeypatch):
    from wide_export.cpu import step

    def refuse(*_args, **_kwargs):
        raise AssertionError("wide_export.cpu was called")

    for name in CPU_FUNCTIONS:
        monkeypatch.setattr(cpu, name, refuse)
    monkeypatch.setattr(step, "decode_step", refuse)


def _generate(model, steps: int = 3, collect=None):
    """A prefill into a preallocated cache, then single-token decode steps (the shapes the CPU step serves)."""
    ids = torch.randint(3, 200, (2, 7), generator=torch.Generator().manual_seed(1))
    past = model.static_cache(2, 7 + steps)
    with torch.no_grad():
        logits, _ = model(ids, torch.ones_like(ids), torch.arange(7).expand(2, -1), past, collect)
        out = [logits]
        for i in range(steps):
            nxt = logits[:, -1:].argmax(-1)
            logits, _ = model(nxt, torch.ones(2, 8 + i, dtype=torch.long), torch.full((2, 1), 7 + i), past, collect)
            out.append(logits)
    return out


def test_a_model_with_the_reference_method_never_calls_the_cpu_kernels(ckpt, monkeypatch):
    """CPU tensors, a preallocated cache, single-token steps: what the CPU method serves; the reference model
    computes every piece itself. A model holding the CPU method in the same process changes nothing (no global
    mode), and that one does reach wide_export.cpu (the patch is seen)."""
    fast = load_wide_model(ckpt).model.eval()
    fast.use_method(CpuKernelsMethod())
    model = load_wide_model(ckpt).model.eval()
    want = _generate(model)
    assert model.method is REFERENCE
    assert all(m.method is REFERENCE for m in model.modules() if hasattr(m, "method"))
    _forbid_cpu(monkeypatch)
    got = _generate(model)
    got += _generate(model, 1, Collector())
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    with pytest.raises(AssertionError, match="wide_export.cpu was called"):
        _generate(fast)


def _k_pruned(model):
    return [linear for layer in model.model.layers for linear in layer.k_pruned()]


@needs_kernels
def test_the_cpu_method_lays_the_k_pruned_weights_out_once(ckpt):
    """W^T [K, N] contiguous behind the module's [N, K] `weight` (same values, same Parameter); preparing again,
    with this method or another CPU one, lays out nothing and copies nothing; the reference method reads the
    same storage."""
    model = load_wide_model(ckpt).model.eval()
    linears = _k_pruned(model)
    assert len(linears) == 4  # o_proj and down_proj of both layers
    before = [(lin.weight, lin.weight.detach().clone()) for lin in linears]
    assert model.use_method(CpuKernelsMethod()) == 4
    laid = [lin.weight.data_ptr() for lin in linears]
    for lin, (param, values) in zip(linears, before):
        assert lin.weight is param and lin.weight.shape == values.shape
        assert lin.weight.t().is_contiguous() and not lin.weight.is_contiguous()
        assert torch.equal(lin.weight, values)
    assert model.use_method(CpuKernelsMethod()) == 0
    assert model.use_method(CpuKernelsMethod(fused_step=False)) == 0
    for lin, ptr, (param, values) in zip(linears, laid, before):
        assert lin.weight is param and lin.weight.data_ptr() == ptr and lin.weight.t().is_contiguous()
        assert torch.equal(lin.weight, values)
    assert model.use_method(ReferenceMethod()) == 0
    assert [lin.weight.data_ptr() for lin in linears] == laid


@needs_kernels
def test_the_cpu_method_gives_the_reference_tokens_and_copies_as_itself(ckpt):
    """float32 greedy tokens of the CPU method equal the reference's; the method object survives deepcopy (it
    holds modules, which copy.deepcopy cannot copy)."""
    import copy

    model = load_wide_model(ckpt).model.eval()
    want = [t[:, -1].argmax(-1) for t in _generate(model, 4)]
    model.use_method(CpuKernelsMethod())
    twin = copy.deepcopy(model)
    assert isinstance(twin.model.layers[0].mlp.method, CpuKernelsMethod)
    assert [t[:, -1].argmax(-1).tolist() for t in _generate(twin, 4)] == [w.tolist() for w in want]


def test_the_export_traces_with_the_reference_and_gives_the_model_its_method_back(ckpt, monkeypatch):
    from wide_export.export import onnx_export

    model = load_wide_model(ckpt).model.eval()
    mine = ReferenceMethod()
    model.use_method(mine)
    seen = []

    def fake_export(traced, *_args, **_kwargs):
        seen.append((traced.method, traced.model.layers[0].self_attn.method))
        return "program"

    monkeypatch.setattr(torch.onnx, "export", fake_export)
    assert onnx_export.trace_program(model, 20, attention_op=True) == "program"
    (top, attn), = seen
    assert isinstance(top, ReferenceMethod) and top is attn and top.attention_op and top is not mine
    assert model.method is mine and model.model.layers[1].mlp.method is mine
