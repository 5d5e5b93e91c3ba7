"""Routing checked against transformers, not against our own reference.

The oracle (tests/model/hf_routing.py) takes the Hugging Face model's own hidden
states through forward pre-hooks, applies the router weights of router.pth by
hand, and masks the transformers forward (o_proj and down_proj inputs). Our
PyTorch reference (wide_export.model) and our ONNX graph (exported by the
library, run by onnxruntime) must reproduce its decisions and its logits, for
llama, qwen2 and qwen3 with attention-only, FFN-only and both routers, on a
left-padded batch, in prefill and in decode with the KV cache.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers import make_checkpoint
from tests.model.hf_routing import load_routed_hf
from wide_export.checkpoint import load_wide_model
from wide_export.model.modeling import Collector

ARCH = {"llama": {}, "qwen2": {}, "qwen3": {"head_dim": 16}}
TARGETS = ("attention", "ffn", "all")
GROUPS = {"attn_groups": 4, "ffn_groups": 12}  # 8 heads / 4 = 2 heads per group; 192 / 12 = 16 channels
VOCAB, BATCH, LENGTH, DECODE = 256, 2, 9, 2
MIN_MARGIN = 1e-4  # decisions closer to a tie than this could differ by float rounding alone


def write_mixed_router(folder: Path, *, hidden: int, layers: int, groups: dict[str, int], rank: int = 16,
                       seed: int = 7) -> None:
    """router.pth with random weights and biases chosen so that groups are mixed per token.

    The router bias adds +0.3 / -0.3 to the execute logit of alternate groups: some
    groups lean to execute, some to skip, and the input still decides (the logit
    spread from the weights is ~1), so about half the decisions go each way.
    Written in bfloat16 under an FSDP-style prefix, as the WIDE trainer does.
    """
    g = torch.Generator().manual_seed(seed)
    state = {}
    for i in range(layers):
        for kind, n in groups.items():
            base = f"_fsdp_wrapped_module.base_model.model.model.layers.{i}.router_{kind}"
            lean = torch.tensor([0.3 if k % 2 == 0 else -0.3 for k in range(n)])
            bias = torch.stack([lean, torch.zeros(n)], dim=-1).reshape(-1) + 0.05 * torch.randn(2 * n, generator=g)
            state[f"{base}.compressor.weight"] = torch.randn(rank, hidden, generator=g) / hidden**0.5
            state[f"{base}.compressor.bias"] = 0.1 * torch.randn(rank, generator=g)
            state[f"{base}.router.weight"] = torch.randn(2 * n, rank, generator=g) / rank**0.5
            state[f"{base}.router.bias"] = bias
    torch.save({k: v.to(torch.bfloat16) for k, v in state.items()}, folder / "router.pth")


def checkpoint(tmp_path: Path, arch: str, target: str, *, lora: bool = False, **extra) -> Path:
    folder = make_checkpoint(tmp_path / "ckpt", arch=arch, sparse_target=target, lora=lora, **ARCH[arch], **GROUPS,
                             **extra)
    groups = {"attention": GROUPS["attn_groups"], "ffn": GROUPS["ffn_groups"]}
    kinds = {k: v for k, v in groups.items() if target in ("all", k)}
    write_mixed_router(folder, hidden=64, layers=2, groups=kinds)
    return folder


def prompt(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (BATCH, LENGTH), generator=g)
    mask = torch.ones(BATCH, LENGTH, dtype=torch.long)
    mask[0, :3] = 0  # left padding
    pos = (mask.cumsum(-1) - 1).clamp(min=0)  # transformers' convention for left padding
    return ids, mask, pos


def check_mixed(masks: dict, margins: dict, real: torch.Tensor, expect: set) -> None:
    """Decisions are genuinely mixed (30-70 % executing, per-token variety) and never near a tie."""
    assert {k for _, k in masks} == expect
    for key, m in masks.items():
        on = m[real].float()
        assert 0.3 <= on.mean() <= 0.7, (key, float(on.mean()))
        # within a token some groups run and some do not; across tokens a group changes its mind
        assert ((on.sum(-1) > 0) & (on.sum(-1) < on.shape[-1])).float().mean() >= 0.5, key
        assert (on.float().std(0) > 0).any(), key
        assert margins[key][real].abs().min() > MIN_MARGIN, (key, float(margins[key][real].abs().min()))


@dataclass
class HFStep:
    """One step of the routed transformers run: its inputs and what the oracle computed."""

    ids: torch.Tensor
    mask: torch.Tensor  # attention mask over past + new tokens
    pos: torch.Tensor
    logits: torch.Tensor
    masks: dict  # (layer, kind) -> bool [B, T, G]
    margins: dict
    real: torch.Tensor  # [B, T] positions whose outputs mean something (not left padding)


def run_hf(hf, ids, mask, pos) -> list[HFStep]:
    """Prefill + DECODE greedy steps through the routed transformers model with its KV cache."""
    steps, cache = [], None
    for k in range(1 + DECODE):
        if k:
            ids = steps[-1].logits[:, -1:].argmax(-1)
            mask = torch.cat([mask, torch.ones(BATCH, 1, dtype=torch.long)], 1)
            pos = pos[:, -1:] + 1
        out = hf(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        real = mask[:, -ids.shape[1]:].bool()
        steps.append(HFStep(ids, mask, pos, out.logits, dict(hf.masks), dict(hf.margins), real))
        for key, margin in hf.margins.items():  # no decision within rounding of a tie, in any step
            assert margin[real].abs().min() > MIN_MARGIN, (k, key, float(margin[real].abs().min()))
    return steps


def routed_steps(folder: Path, target: str, lora: Path | None = None) -> list[HFStep]:
    hf = load_routed_hf(folder, lora=lora)
    steps = run_hf(hf, *prompt())
    check_mixed(steps[0].masks, steps[0].margins, steps[0].real,
                {"attention", "ffn"} if target == "all" else {target})
    return steps


def test_masks_are_mixed_and_routing_matters(tmp_path):
    """The oracle itself: mixed decisions, and routing changes the transformers output."""
    folder = checkpoint(tmp_path, "llama", "all")
    hf = load_routed_hf(folder)
    ids, mask, pos = prompt()
    routed = hf(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    check_mixed(hf.masks, hf.margins, mask.bool(), {"attention", "ffn"})
    hf.remove()
    dense = hf(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    assert (routed - dense)[mask.bool()].abs().max() > 0.1


def _compare_reference(folder: Path, target: str, lora: Path | None = None) -> None:
    steps = routed_steps(folder, target, lora)
    ours = load_wide_model(folder, lora=lora).model
    past = ours.empty_cache(BATCH)
    with torch.no_grad():
        for k, step in enumerate(steps):
            collect = Collector()
            logits, past = ours(step.ids, step.mask, step.pos, past, collect)
            assert {(i, kind) for i, d in enumerate(collect.masks) for kind in d} == set(step.masks)
            for (layer, kind), want in step.masks.items():
                got = collect.masks[layer][kind].bool()
                assert torch.equal(got[step.real], want[step.real]), f"step {k} layer {layer} {kind}: decisions differ"
            torch.testing.assert_close(logits[step.real], step.logits[step.real], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("arch", list(ARCH))
def test_reference_matches_routed_transformers(tmp_path, arch, target):
    _compare_reference(checkpoint(tmp_path, arch, target), target)


def test_reference_with_lora_matches_hand_merged_transformers(tmp_path):
    folder = checkpoint(tmp_path, "llama", "all", lora=True)
    _compare_reference(folder, "all", lora=folder / "lora.pth")


def _session_with_router_outputs(path: Path):
    """ORT session of the exported graph with every WideRouter's mask also a graph output.

    Returns (session, {output name: (layer, kind)}), layer and kind read from the node names,
    which follow the module tree (/model/layers.{i}/router_{kind}/...).
    """
    import onnx
    import onnxruntime as ort

    model = onnx.load(str(path))
    routers = {}
    for node in model.graph.node:
        if node.op_type == "WideRouter":
            m = re.match(r"/model/layers\.(\d+)/router_(attention|ffn)/", node.name)
            assert m, node.name
            routers[node.output[0]] = (int(m.group(1)), m.group(2))
            model.graph.output.append(onnx.helper.make_tensor_value_info(node.output[0], onnx.TensorProto.INT32, None))
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess, routers


def _compare_onnx(folder: Path, out: Path, target: str, lora: Path | None = None) -> None:
    """Export with the library, run every step in onnxruntime: logits and decisions as the routed HF model."""
    from wide_export.export.onnx_export import export_onnx

    steps = routed_steps(folder, target, lora)
    export_onnx(load_wide_model(folder, lora=lora), out)
    sess, routers = _session_with_router_outputs(out / "model.onnx")
    assert set(routers.values()) == set(steps[0].masks)
    names = [o.name for o in sess.get_outputs()]
    past = {}
    for i in sess.get_inputs():
        if i.name.startswith("past_key_values."):
            _, heads, _, dim = i.shape
            past[i.name] = np.zeros((BATCH, heads, 0, dim), np.float32)
    for k, step in enumerate(steps):
        feed = {"input_ids": step.ids.numpy(), "attention_mask": step.mask.numpy(), "position_ids": step.pos.numpy()}
        res = dict(zip(names, sess.run(None, {**feed, **past})))
        past = {name.replace("present.", "past_key_values."): v for name, v in res.items()
                if name.startswith("present.")}
        for name, key in routers.items():
            got = torch.from_numpy(res[name]).bool()
            assert torch.equal(got[step.real], step.masks[key][step.real]), f"step {k} {key}: ONNX decisions differ"
        torch.testing.assert_close(torch.from_numpy(res["logits"])[step.real], step.logits[step.real],
                                   rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("arch", list(ARCH))
def test_onnx_matches_routed_transformers(tmp_path, arch, target):
    _compare_onnx(checkpoint(tmp_path, arch, target), tmp_path / "onnx", target)


def test_onnx_with_lora_matches_hand_merged_transformers(tmp_path):
    folder = checkpoint(tmp_path, "qwen2", "all", lora=True)
    _compare_onnx(folder, tmp_path / "onnx", "all", lora=folder / "lora.pth")


# ---- attention_bias: transformers' Llama (and Qwen3) then give q, k, v AND o_proj a bias --------------------
def _bias_checkpoint(tmp_path: Path, arch: str) -> Path:
    folder = checkpoint(tmp_path, arch, "all", attention_bias=True)
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        biases = {k for k in f.keys() if k.endswith(".bias")}
    assert "model.layers.0.self_attn.o_proj.bias" in biases and "model.layers.1.self_attn.q_proj.bias" in biases
    return folder


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_reference_with_attention_bias_matches_routed_transformers(tmp_path, arch):
    _compare_reference(_bias_checkpoint(tmp_path, arch), "all")


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_onnx_with_attention_bias_matches_routed_transformers(tmp_path, arch):
    _compare_onnx(_bias_checkpoint(tmp_path, arch), tmp_path / "onnx", "all")


def test_bf16_onnx_matches_routed_transformers_at_bf16_tolerance(tmp_path):
    """A bfloat16 export of an attention_bias Llama, run as written by onnx's reference evaluator (ONNX
    Runtime's CPU provider has no bf16 kernels), against the float32 routed transformers model: router
    decisions agree (a flip only on a near-tie, |margin| < 0.25) and logits within bf16 rounding."""
    import onnx

    from wide_export.export.onnx_export import export_onnx
    from wide_export.verify.evaluator import EvaluatorSession, bfloat16

    folder = _bias_checkpoint(tmp_path, "llama")
    steps = routed_steps(folder, "all")
    export_onnx(load_wide_model(folder, dtype="bfloat16"), tmp_path / "onnx")
    model = onnx.load(str(tmp_path / "onnx" / "model.onnx"))
    routers = {}
    for node in model.graph.node:
        if node.op_type == "WideRouter":
            m = re.match(r"/model/layers\.(\d+)/router_(attention|ffn)/", node.name)
            routers[node.output[0]] = (int(m.group(1)), m.group(2))
            model.graph.output.append(onnx.helper.make_tensor_value_info(node.output[0], onnx.TensorProto.INT32, None))
    session = EvaluatorSession(model)
    past = {f"past_key_values.{i}.{kv}": np.zeros((BATCH, 2, 0, 8), bfloat16()) for i in range(2)
            for kv in ("key", "value")}
    decisions = flips = 0
    for k, step in enumerate(steps):
        feed = {"input_ids": step.ids.numpy(), "attention_mask": step.mask.numpy(), "position_ids": step.pos.numpy()}
        res = dict(zip(session.output_names, session.run(None, {**feed, **past})))
        past = {n.replace("present.", "past_key_values."): v for n, v in res.items() if n.startswith("present.")}
        assert res["present.0.key"].dtype == bfloat16()
        for name, key in routers.items():
            got = torch.from_numpy(res[name]).bool()[step.real]
            want, margin = step.masks[key][step.real], step.margins[key][step.real]
            flipped = got != want
            assert (margin[flipped].abs() < 0.25).all(), f"step {k} {key}: a clear decision flipped"
            decisions, flips = decisions + want.numel(), flips + int(flipped.sum())
        err = (torch.from_numpy(res["logits"])[step.real] - step.logits[step.real]).abs()
        assert err.mean() < 0.1 and err.max() < 1.0, (k, float(err.mean()), float(err.max()))
        assert err.max() > 0  # a bf16 run, not float32
    assert 1 - flips / decisions >= 0.9, (flips, decisions)
