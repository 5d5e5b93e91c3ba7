"""The Python API refuses misuse instead of computing something else: the reference model
(wide_export/model/modeling.py) fed a past cache that does not have one entry per layer."""

from __future__ import annotations

import pytest
import torch

from wide_export.checkpoint import load_wide_model
from wide_export.base.errors import WideError


@pytest.fixture(scope="module")
def model():
    return load_wide_model(None, dtype="float32").model


def _inputs(model, batch=2, new=3):
    ids = torch.randint(0, model.config.vocab_size, (batch, new), generator=torch.Generator().manual_seed(0))
    return ids, torch.ones(batch, new, dtype=torch.long), torch.arange(new).expand(batch, new)


@pytest.mark.parametrize("extra", [None, -1, +1])
def test_past_of_the_wrong_length_is_an_error(model, extra):
    n = model.config.num_layers
    past = [] if extra is None else model.empty_cache(2)[: n + extra] if extra < 0 else model.empty_cache(2) * 2
    with pytest.raises(WideError, match=f"^past_key_values .* {len(past)} entries.* {n} layers"):
        model(*_inputs(model), past)


def test_empty_cache_runs_every_layer(model):
    with torch.no_grad():
        logits, presents = model(*_inputs(model), model.empty_cache(2))
    c = model.config
    assert logits.shape == (2, 3, c.vocab_size) and torch.isfinite(logits).all()
    assert len(presents) == c.num_layers  # one present per layer, each holding the 3 new positions
    assert all(k.shape == (2, c.num_key_value_heads, 3, c.head_dim) for k, _ in presents)


def test_the_export_pipeline_is_a_library_call(tmp_path):
    """What `wide-export onnx` does, without the CLI: export.pipeline.export_and_verify of checkpoint.Sources
    publishes the folder with its verification report; a sharded one the same through tp.pipeline."""
    import json

    from wide_export.checkpoint import Sources
    from wide_export.pipelines.onnx import export_and_verify
    from wide_export.pipelines.tp import export_tp_and_verify

    run = export_and_verify(Sources(), tmp_path / "out", steps=1)
    assert run.report is not None and run.report.passed
    assert sum(run.result.wide_nodes.values()) > 0 and (tmp_path / "out" / "model.onnx").is_file()
    assert json.loads((tmp_path / "out" / "verify_report.json").read_text())["passed"] is True
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # the hidden staging folder is gone
    run = export_tp_and_verify(Sources(), tmp_path / "tp", tp=2, steps=1)
    assert run.report.passed and run.result["world_size"] == 2 and (tmp_path / "tp" / "rank1" / "model.onnx").is_file()
    nothing = export_and_verify(Sources(), tmp_path / "unverified", verify=False)
    assert nothing.report is None and not (tmp_path / "unverified" / "verify_report.json").exists()


def test_sources_load_what_the_loader_loads_from_the_same_options():
    from wide_export.checkpoint import Sources

    s = Sources(lora_scale=1.5)
    assert s.reference_kwargs() == {"model_dir": None, "router": None, "lora": None, "lora_scale": 1.5}
    assert s.given_paths() == (None, None, None)
    a, b = s.load(dtype="float32").model, load_wide_model(None, lora_scale=1.5, dtype="float32").model
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_sources_pass_every_option_to_the_loader(monkeypatch, tmp_path):
    from pathlib import Path

    from wide_export.checkpoint import Sources, loader

    seen = {}
    monkeypatch.setattr(loader, "load_wide_model", lambda model_dir, **kw: seen.update(model_dir=model_dir, **kw))
    s = Sources(tmp_path, Path("r.pth"), Path("l.pth"), 0.5, 3, 7)
    s.load(dtype="float16", lazy=True)
    assert seen == {"model_dir": tmp_path, "router": Path("r.pth"), "lora": Path("l.pth"), "lora_scale": 0.5,
                    "attn_group_size": 3, "ffn_group_size": 7, "dtype": "float16", "lazy": True}
    assert s.reference_kwargs() == {"model_dir": tmp_path, "router": Path("r.pth"), "lora": Path("l.pth"),
                                    "lora_scale": 0.5}
    assert s.given_paths() == (tmp_path, Path("r.pth"), Path("l.pth"))
