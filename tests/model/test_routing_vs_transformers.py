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


def checkpoint(tmp_path: Path, arch: str, target: str, *, lora: bool = False) -> Path:
    folder = make_checkpoint(tmp_path / "ckpt", arch=arch, sparse_target=target, lora=lora, **ARCH[arch], **GROUPS)
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


def run_hf(hf, ids, mask, pos):
    """Prefill + DECODE greedy steps through the routed transformers model; per step logits, masks, margins."""
    steps = []
    out = hf(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
    steps.append((out.logits, dict(hf.masks), dict(hf.margins), mask.bool()))
    cache = out.past_key_values
    for _ in range(DECODE):
        nxt = out.logits[:, -1:].argmax(-1)
        mask = torch.cat([mask, torch.ones(BATCH, 1, dtype=torch.long)], 1)
        pos = pos[:, -1:] + 1
        out = hf(input_ids=nxt, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        steps.append((out.logits, dict(hf.masks), dict(hf.margins), torch.ones(BATCH, 1, dtype=torch.bool)))
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


def _compare_reference(folder: Path, target: str, lora: Path | None = None) -> list:
    hf = load_routed_hf(folder, lora=lora)
    ids, mask, pos = prompt()
    steps = run_hf(hf, ids, mask, pos)
    expect = {"attention", "ffn"} if target == "all" else {target}
    check_mixed(steps[0][1], steps[0][2], steps[0][3], expect)

    loaded = load_wide_model(folder, lora=lora)
    ours = loaded.model
    past = ours.empty_cache(BATCH)
    step_ids, step_mask, step_pos = ids, mask, pos
    with torch.no_grad():
        for k, (want, masks, margins, real) in enumerate(steps):
            if k:
                step_ids = steps[k - 1][0][:, -1:].argmax(-1)
                step_mask = torch.cat([step_mask, torch.ones(BATCH, 1, dtype=torch.long)], 1)
                step_pos = step_pos[:, -1:] + 1
            collect = Collector()
            logits, past = ours(step_ids, step_mask, step_pos, past, collect)
            for (layer, kind), m in masks.items():
                got = collect.masks[layer][kind].bool()
                assert torch.equal(got[real], m[real]), f"step {k} layer {layer} {kind}: decisions differ"
            assert {(i, kind) for i, d in enumerate(collect.masks) for kind in d} == set(masks)
            torch.testing.assert_close(logits[real], want[real], rtol=1e-4, atol=1e-4)
    return steps


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("arch", list(ARCH))
def test_reference_matches_routed_transformers(tmp_path, arch, target):
    _compare_reference(checkpoint(tmp_path, arch, target), target)


def test_reference_with_lora_matches_hand_merged_transformers(tmp_path):
    folder = checkpoint(tmp_path, "llama", "all", lora=True)
    _compare_reference(folder, "all", lora=folder / "lora.pth")


def _onnx_logits(folder: Path, out: Path, steps, ids, mask, pos, lora: Path | None = None) -> None:
    import onnxruntime as ort

    from wide_export.export.onnx_export import export_onnx

    export_onnx(load_wide_model(folder, lora=lora), out)
    sess = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    past = {}
    for i in sess.get_inputs():
        if i.name.startswith("past_key_values."):
            _, heads, _, dim = i.shape
            past[i.name] = np.zeros((BATCH, heads, 0, dim), np.float32)
    step_ids, step_mask, step_pos = ids, mask, pos
    for k, (want, _masks, _margins, real) in enumerate(steps):
        if k:
            step_ids = steps[k - 1][0][:, -1:].argmax(-1)
            step_mask = torch.cat([step_mask, torch.ones(BATCH, 1, dtype=torch.long)], 1)
            step_pos = step_pos[:, -1:] + 1
        res = dict(zip(names, sess.run(None, {"input_ids": step_ids.numpy(), "attention_mask": step_mask.numpy(),
                                               "position_ids": step_pos.numpy(), **past})))
        past = {name.replace("present.", "past_key_values."): v for name, v in res.items()
                if name.startswith("present.")}
        torch.testing.assert_close(torch.from_numpy(res["logits"])[real], want[real], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("arch", list(ARCH))
def test_onnx_matches_routed_transformers(tmp_path, arch, target):
    folder = checkpoint(tmp_path, arch, target)
    hf = load_routed_hf(folder)
    ids, mask, pos = prompt()
    steps = run_hf(hf, ids, mask, pos)
    check_mixed(steps[0][1], steps[0][2], steps[0][3], {"attention", "ffn"} if target == "all" else {target})
    _onnx_logits(folder, tmp_path / "onnx", steps, ids, mask, pos)


def test_onnx_with_lora_matches_hand_merged_transformers(tmp_path):
    folder = checkpoint(tmp_path, "qwen2", "all", lora=True)
    lora = folder / "lora.pth"
    hf = load_routed_hf(folder, lora=lora)
    ids, mask, pos = prompt()
    steps = run_hf(hf, ids, mask, pos)
    _onnx_logits(folder, tmp_path / "onnx", steps, ids, mask, pos, lora=lora)
