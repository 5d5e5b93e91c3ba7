"""Recipes, profile limits, profile shapes and the plugin-layer report: pure Python, no TensorRT."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from wide_export.base.errors import WideError
from wide_export.trt.profiles import build_profiles
from wide_export.trt.recipes import ProfileLimits, check_group_sizes, list_recipes, load_recipe
from wide_export.trt.report import plugin_report
from wide_export.verify.tolerances import tolerance_for


def _write(tmp_path, data, name="r.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data) if name.endswith(".json") else data)
    return path


def test_shipped_recipes_parse():
    names = list_recipes()
    assert {"llama-3.1-8b", "qwen3-8b"} <= set(names)
    for name in names:
        recipe = load_recipe(name)
        assert recipe.name == name
        assert recipe.attention_heads_per_group and recipe.ffn_channels_per_group
        assert recipe.limits.max_input_len <= recipe.limits.max_seq_len
        for precision in ("float16", "float32"):
            tol = recipe.tolerance(precision)
            assert 0 < tol.min_agreement <= 1 and tol.atol > 0


def test_llama_recipe_values():
    r = load_recipe("llama-3.1-8b")
    raw = json.loads((Path(__file__).parents[2] / "wide_export" / "recipes" / "llama-3.1-8b.json").read_text())
    # Llama-3.1-8B (its config.json): 32 query heads over 8 KV heads, intermediate_size 14336.
    # The recipe promises one GQA group (32 / 8 heads) per attention group and 112 FFN groups.
    assert r.attention_heads_per_group == 32 // 8 == raw["group_sizes"]["attention_heads_per_group"]
    assert 14336 // r.ffn_channels_per_group == 112 and 14336 % r.ffn_channels_per_group == 0
    assert r.limits == ProfileLimits(**raw["profiles"])  # the loader keeps every limit in its place
    assert r.limits.checked(131072) == r.limits  # within Llama-3.1's max_position_embeddings


def test_recipe_overrides_only_given_tolerance_fields(tmp_path):
    path = _write(tmp_path, {"name": "x", "tolerances": {"float16": {"atol": 0.5}}})
    recipe = load_recipe(path)
    default = tolerance_for("float16")
    assert recipe.tolerance("float16").atol == 0.5
    assert recipe.tolerance("float16").rtol == default.rtol
    assert recipe.tolerance("float32") == tolerance_for("float32")


def test_toml_recipe(tmp_path):
    pytest.importorskip("tomllib")
    path = _write(tmp_path, 'name = "t"\n[profiles]\nmax_batch = 2\nmax_input_len = 16\nmax_seq_len = 32\n',
                  name="t.toml")
    assert load_recipe(path).limits == ProfileLimits(2, 16, 32)


@pytest.mark.parametrize("data, message", [
    ({"name": "x", "profiles": {"max_input_len": 512, "max_seq_len": 256}}, "contradict"),
    ({"name": "x", "profiles": {"max_batch": 0}}, "positive integer"),
    ({"name": "x", "profiles": {"max_batch": 2.5}}, "positive integer"),
    ({"name": "x", "profiles": {"max_tokens": 2}}, "unknown keys"),
    ({"name": "x", "bogus": 1}, "unknown top-level"),
    ({"model": "no name"}, "needs a string `name`"),
    ({"name": "x", "tolerances": {"float16": {"min_agreement": 1.5}}}, "min_agreement"),
    ({"name": "x", "tolerances": {"float16": {"stat": "worst"}}}, "stat must be"),
    ({"name": "x", "tolerances": {"int8": {}}}, "unknown keys"),
    ({"name": "x", "group_sizes": {"ffn_channels_per_group": -4}}, "positive integer"),
])
def test_bad_recipes(tmp_path, data, message):
    with pytest.raises(WideError, match=message):
        load_recipe(_write(tmp_path, data))


def test_missing_and_invalid_recipe_files(tmp_path):
    with pytest.raises(WideError, match="not found"):
        load_recipe(tmp_path / "nope.json")
    with pytest.raises(WideError, match="not a valid recipe"):
        bad = tmp_path / "bad.json"
        bad.write_text("{not json")
        load_recipe(bad)


@pytest.mark.parametrize("limits, message", [
    (ProfileLimits(1, 300, 200), "contradict"),
    (ProfileLimits(1, 1, 1), "no room to decode"),
    (ProfileLimits(0, 8, 16), "positive"),
])
def test_contradictory_limits(limits, message):
    with pytest.raises(WideError, match=message):
        limits.checked()


def test_limits_vs_max_position_embeddings():
    with pytest.raises(WideError, match="max_position_embeddings"):
        ProfileLimits(1, 16, 4096).checked(max_position_embeddings=2048)
    assert ProfileLimits(1, 16, 2048).checked(max_position_embeddings=2048).max_seq_len == 2048


def test_group_sizes_checked_against_export():
    recipe = load_recipe("llama-3.1-8b")
    ok = {"layers": [{"attention": {"heads_per_group": 4}, "ffn": {"group_size": 128}}, {"attention": None,
                                                                                        "ffn": None}]}
    check_group_sizes(recipe, ok, "cfg")
    bad = {"layers": [{"attention": {"heads_per_group": 4}, "ffn": {"group_size": 64}}]}
    with pytest.raises(WideError, match="ffn_channels_per_group=64"):
        check_group_sizes(recipe, bad, "cfg")


def _inputs(layers=2, heads=2, dim=8):
    inputs = [("input_ids", [-1, -1]), ("attention_mask", [-1, -1]), ("position_ids", [-1, -1])]
    for i in range(layers):
        inputs += [(f"past_key_values.{i}.{kv}", [-1, heads, -1, dim]) for kv in ("key", "value")]
    return inputs


def test_prefill_and_decode_profiles():
    prefill, decode = build_profiles(_inputs(), ProfileLimits(max_batch=3, max_input_len=20, max_seq_len=50))
    assert (prefill.name, decode.name) == ("prefill", "decode")
    lo, opt, hi = prefill.shapes["input_ids"]
    assert lo == (1, 1) and hi == (3, 20) and all(a <= b <= c for a, b, c in zip(lo, opt, hi))
    assert prefill.shapes["past_key_values.1.value"][2] == (3, 2, 0, 8)  # past length fixed at 0
    assert prefill.shapes["attention_mask"][2] == (3, 20)
    assert decode.shapes["input_ids"][0] == (1, 1) and decode.shapes["input_ids"][2] == (3, 1)
    lo, _, hi = decode.shapes["past_key_values.0.key"]
    assert lo == (1, 2, 1, 8) and hi == (3, 2, 49, 8)
    assert decode.shapes["attention_mask"][2] == (3, 50)  # past + 1 new token
    assert decode.to_dict(1)["shapes"]["attention_mask"]["max"] == [3, 50]


def test_profiles_refuse_unknown_inputs():
    with pytest.raises(WideError, match="not one the engine profiles know"):
        build_profiles(_inputs() + [("pixel_values", [-1, 3, 224, 224])], ProfileLimits())
    with pytest.raises(WideError, match="static size"):
        build_profiles([("past_key_values.0.key", [-1, -1, -1, 8])], ProfileLimits())


def test_plugin_report_classifies_nodes():
    nodes = [("/a/WideRouter", "WideRouter"), ("/b/WideMaskedGemmK", "WideMaskedGemmK"),
             ("/c/WideMaskedGemmK", "WideMaskedGemmK")]
    report = plugin_report(nodes, {"/a/WideRouter", "/c/WideMaskedGemmK", "/other"})
    assert [n.name for n in report.plugin] == ["/a/WideRouter", "/c/WideMaskedGemmK"]
    assert [n.name for n in report.inlined] == ["/b/WideMaskedGemmK"]
    d = report.to_dict()
    assert (d["total"], d["plugin_layers"], d["inlined"]) == (3, 2, 1)
    assert d["by_op"]["WideMaskedGemmK"] == {"plugin_layers": 1, "inlined": 1}
