"""Tensor-parallel export: per-rank graphs verified against the UNSHARDED PyTorch reference.

Every rank runs in ONNX Runtime; the DistCollective all-reduces are simulated (the ranks' partials summed
between stages). Verdicts: float32 max |err| / max |ref| <= 1e-5 per output and identical router decisions.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from tests.helpers import assert_one_line_error, make_checkpoint

SPECS = {  # kv heads 4 so that both TP=2 and TP=4 divide; 12 FFN groups, 4 attention groups
    "llama": dict(arch="llama", num_layers=3, num_heads=8, num_kv_heads=4, attn_groups=4, ffn_groups=12, seed=3),
    "qwen3": dict(arch="qwen3", num_layers=2, num_heads=8, num_kv_heads=4, head_dim=32, attn_groups=4,
                  ffn_groups=12, seed=5),
}


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("tp")
    return {name: make_checkpoint(root / name, **spec) for name, spec in SPECS.items()}


def _export(ckpt: Path, out: Path, tp: int, plan=None):
    from wide_export.checkpoint import load_wide_model
    from wide_export.tp.export import export_tp
    from wide_export.tp.plan import identity_plan

    loaded = load_wide_model(ckpt, lazy=True, checksums=False)
    return export_tp(loaded, out, plan or identity_plan(loaded.config, tp))


def _verify(out: Path, ckpt: Path):
    from wide_export.pipelines.verify import verify_onnx

    return verify_onnx(out, load_kwargs={"model_dir": ckpt}, steps=2)


@pytest.mark.parametrize("arch,tp", [("llama", 2), ("llama", 4), ("qwen3", 2), ("qwen3", 4)])
def test_sharded_export_is_exact_against_the_unsharded_reference(ckpts, tmp_path, arch, tp):
    import onnx

    out = tmp_path / "tp"
    manifest = _export(ckpts[arch], out, tp)
    layers = SPECS[arch]["num_layers"]
    assert manifest["world_size"] == tp and len(manifest["ranks"]) == tp
    for r in range(tp):
        proto = onnx.load(str(out / f"rank{r}" / "model.onnx"))
        colls = [n for n in proto.graph.node if n.op_type == "DistCollective"]
        assert len(colls) == 2 * layers
        for n in colls:  # as Polygraphy's multi-device shard writes them
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
            assert n.domain == "" and attrs["collective_operation"] == b"all_reduce" and attrs["reduce_op"] == b"sum"
            assert attrs["group_size"] == tp and "root" in attrs and list(attrs["groups"]) == []
        inits = {t.name: t for t in proto.graph.initializer}
        q = inits["model.layers.0.self_attn.q_proj.weight"]
        head_dim = SPECS[arch].get("head_dim") or 64 // 8
        assert list(q.dims) == [8 // tp * head_dim, 64]  # this rank's heads only
        assert list(inits["model.layers.0.mlp.down_proj.weight"].dims) == [64, 192 // tp]
        assert list(inits["model.layers.0.router_ffn.router.weight"].dims) == [24, 16]  # router whole
    report = _verify(out, ckpts[arch])
    assert report.passed, report.to_dict()
    rows = {r.name: r for r in report.outputs}
    exact = [r for name, r in rows.items() if name.startswith("tp exact")]
    assert len(exact) == 2 and all(r.max_rel <= 1e-5 for r in exact)
    assert all(d.flips == 0 and d.agreement == 1.0 for d in report.decisions)
    assert len(report.decisions) == 2 * layers


def _cli(*args):
    from wide_export.cli import app

    return CliRunner().invoke(app, [*map(str, args)])


def test_tp_that_does_not_divide_is_one_line(ckpts, tmp_path):
    line = assert_one_line_error(_cli("onnx", "--model", ckpts["llama"], "--output", tmp_path / "o", "--tp", 3))
    assert "--tp 3 " in line and "num_key_value_heads=4" in line
    assert not (tmp_path / "o").exists()
    line = assert_one_line_error(_cli("onnx", "--model", ckpts["llama"], "--output", tmp_path / "o",
                                      "--balance-text", tmp_path / "t.txt"))
    assert "add --tp N" in line


def test_rank_model_in_a_world_of_one_is_the_reference(ckpts):
    """A world of one: the rank model (eager, all-reduce = identity) computes the reference exactly."""
    import torch

    from wide_export.checkpoint import load_wide_model
    from wide_export.tp.model import to_rank_model
    from wide_export.tp.plan import rank_config

    loaded = load_wide_model(ckpts["qwen3"], checksums=False)
    ref = loaded.model
    cfg = ref.config
    from wide_export.model.modeling import WideForCausalLM

    rank = WideForCausalLM(rank_config(cfg, 1), ref.model.inv_freq, ref.model.rope_scaling)
    rank.load_state_dict(ref.state_dict())
    to_rank_model(rank, cfg, 1, 0)
    ids = torch.randint(0, cfg.vocab_size, (2, 5))
    args = (ids, torch.ones_like(ids), torch.arange(5).expand(2, 5), ref.empty_cache(2))
    with torch.no_grad():
        a, b = ref(*args)[0], rank(*args)[0]
    assert torch.equal(a, b)
    assert not np.isnan(a.numpy()).any()


@pytest.mark.parametrize("model,kv", [("llama", 4), (None, 2)])
def test_a_world_size_config_json_refuses_is_refused_before_torch_is_imported(ckpts, tmp_path, model, kv):
    """Cheap refusals first: `--tp 3` against config.json's KV heads needs no torch, no router file
    and no weights (it took 11.6 s)."""
    import subprocess
    import sys

    code = ("import sys\nfrom wide_export.cli import main\ntry:\n    main(sys.argv[1:])\n"
            "except SystemExit as e:\n    print('torch imported:', 'torch' in sys.modules, 'exit:', e.code)\n"
            "    raise")
    args = ["onnx", "--tp", "3", "--output", str(tmp_path / "out")] + (["--model", str(ckpts[model])] if model else [])
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "torch imported: False exit: 2", done.stdout + done.stderr
    line = assert_one_line_error(done)
    assert "--tp 3 " in line and f"num_key_value_heads={kv}" in line
    assert not (tmp_path / "out").exists()
