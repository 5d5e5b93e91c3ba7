"""Balanced FFN placement: measured on text, still exact, predicted slowest rank not busier."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.helpers import make_checkpoint

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from wide_export.model.demo_tokenizer import write_demo_tokenizer

    root = tmp_path_factory.mktemp("tpb")
    folder = make_checkpoint(root / "model", arch="llama", num_layers=3, num_heads=8, num_kv_heads=4,
                             attn_groups=4, ffn_groups=12, seed=7)
    write_demo_tokenizer(folder)  # byte-level, vocab 256 = the synthetic model's
    text = root / "text.txt"
    text.write_text((ROOT / "README.md").read_text(encoding="utf-8")[:3000], encoding="utf-8")  # real English
    return folder, text


def _cli(*args):
    from wide_export.cli import app

    return CliRunner().invoke(app, [*map(str, args)])


def _rates_by_hand(folder: Path, text: Path) -> dict[int, list[float]]:
    """Per FFN group, the fraction of the text's tokens whose reference router executes it (one window)."""
    import torch
    from tokenizers import Tokenizer

    from wide_export.checkpoint import load_wide_model
    from wide_export.model.modeling import Collector

    model = load_wide_model(folder, checksums=False).model
    ids = Tokenizer.from_file(str(folder / "tokenizer.json")).encode(text.read_text()).ids
    out: dict[int, torch.Tensor] = {}
    for a in range(0, len(ids), 512):
        x = torch.tensor([ids[a:a + 512]])
        if x.shape[1] < 2:
            continue
        c = Collector()
        with torch.no_grad():
            model(x, torch.ones_like(x), torch.arange(x.shape[1])[None], model.empty_cache(1), collect=c)
        for i, m in enumerate(c.masks):
            s = m["ffn"][0].double().sum(0)
            out[i] = s if i not in out else out[i] + s
    n = sum(min(512, len(ids) - a) for a in range(0, len(ids), 512) if len(ids) - a >= 2)
    return {i: (v / n).tolist() for i, v in out.items()}


def test_balanced_export_is_exact_and_no_rank_gets_busier(ckpt, tmp_path):
    folder, text = ckpt
    out = tmp_path / "tp"
    res = _cli("onnx", "--model", folder, "--output", out, "--tp", 2, "--balance-text", text, "--steps", 2)
    assert res.exit_code == 0, res.output
    assert "PASSED" in res.output and "balanced" in res.output
    manifest = json.loads((out / "tp_manifest.json").read_text())
    assert manifest["ffn_placement"]["kind"] == "balanced"
    orders = manifest["ffn_placement"]["group_order"]
    assert all(sorted(o) == list(range(12)) for o in orders)
    assert any(o != list(range(12)) for o in orders), "nothing was rebalanced on this text"
    report = json.loads((out / "verify_report.json").read_text())  # exact with permuted groups
    assert report["passed"]
    assert all(d["flips"] == 0 for d in report["decisions"])
    # the predicted loads, recomputed from an independent count of the reference's decisions
    rates = _rates_by_hand(folder, text)
    summary = manifest["balance"]["summary"]
    befores, afters = [], []
    for i, order in enumerate(orders):
        p = rates[i]
        per_rank = lambda o: [sum(p[g] for g in o[r * 6:(r + 1) * 6]) / 6 for r in range(2)]  # noqa: E731
        befores.append(max(per_rank(list(range(12)))))
        afters.append(max(per_rank(order)))
        assert afters[-1] <= befores[-1] + 1e-12
        lay = manifest["balance"]["layers"][i]
        assert lay["after"] == pytest.approx(per_rank(order), abs=1e-9)
    assert summary["slowest_rank_load_before"] == pytest.approx(sum(befores) / 3, abs=1e-9)
    assert summary["slowest_rank_load_after"] == pytest.approx(sum(afters) / 3, abs=1e-9)
    assert summary["slowest_rank_load_after"] < summary["slowest_rank_load_before"]
    # rank 1's gate rows are the checkpoint's rows of the groups it was given, in that order
    import onnx
    from onnx import numpy_helper
    from safetensors.torch import load_file

    gate = load_file(str(folder / "model.safetensors"))["model.layers.0.mlp.gate_proj.weight"].numpy()
    proto = onnx.load(str(out / "rank1" / "model.onnx"))
    got = numpy_helper.to_array(next(t for t in proto.graph.initializer
                                     if t.name == "model.layers.0.mlp.gate_proj.weight"))
    rows = [g * 16 + c for g in orders[0][6:] for c in range(16)]
    assert (got == gate[rows]).all()


def test_balanced_order_never_worse_and_balances_a_skewed_layer():
    from wide_export.tp.balance import balanced_order, rank_loads

    skew = [0.9] * 6 + [0.1] * 6  # identity puts every busy group on rank 0
    order = balanced_order(skew, 2)
    assert max(rank_loads(skew, order, 2)) == pytest.approx(0.5)
    flat = [0.5] * 8
    assert balanced_order(flat, 4) == list(range(8))  # nothing to gain: the identity stays


def test_analyze_tp_prints_the_loads(ckpt, tmp_path):
    folder, text = ckpt
    res = _cli("analyze", "--model", folder, "--text", text, "--tp", 2, "--output", tmp_path / "a")
    assert res.exit_code == 0, res.output
    assert "predicted slowest-rank FFN load: identity" in res.output
    data = json.loads((tmp_path / "a" / "analyze.json").read_text())
    s = data["tp"]["summary"]
    assert s["slowest_rank_load_after"] <= s["slowest_rank_load_before"]
    res = _cli("analyze", "--model", folder, "--text", text, "--tp", 3, "--output", tmp_path / "b")
    assert res.exit_code == 2 and "does not divide" in res.output
