"""tritonserver/engines.py on engine folders written here (tests/triton/engine_manifest.py): what
read_engine_folder returns for a manifest and each refusal's exact message -- the answers written out
by hand from the schema in the module's docstring, no TensorRT."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from wide_export.base.errors import WideError
from wide_export.tritonserver import trt_engines as engines
from wide_export.tritonserver.trt_engines import ProfileSpec, TensorSpec, read_engine_folder
from wide_export.tritonserver.export_folder import DEFAULT_IO, ModelShape

from tests.triton.engine_manifest import write_engine_folder

REBUILD = "wide-export trt"  # what the rebuild hint names


def _rewrite(folder: Path, change) -> Path:
    """Apply `change` to the folder's manifest (a dict, edited in place) and write it back."""
    path = folder / "wide_engine.json"
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))
    return path


def _refusal(folder: Path) -> WideError:
    with pytest.raises(WideError) as err:
        read_engine_folder(folder)
    return err.value


# -- what a good manifest gives
def test_a_manifest_read_into_engines_profiles_and_model(tmp_path):
    """The written manifest (2 layers, float16 KV, vocab 97) comes back field by field."""
    folder = tmp_path / "engines"
    write_engine_folder(folder, layers=2, vocab=97, heads=2, dim=4, max_pos=4096)
    src = read_engine_folder(folder)
    assert src.folder == folder and src.manifest == folder / "wide_engine.json"
    assert src.shape == ModelShape(num_layers=2, num_kv_heads=2, head_dim=4, vocab_size=97, kv_dtype="float16",
                                   max_position_embeddings=4096)
    assert (src.trt_package, src.trt_version) == ("tensorrt_rtx", "1.7.1")
    assert src.plugins == (folder / "libwide_plugins.so",)
    assert src.io == DEFAULT_IO
    (engine,) = src.engines
    assert engine.file == folder / "model.engine"
    assert engine.inputs[:4] == (
        TensorSpec("input_ids", "TYPE_INT64", (-1, -1)), TensorSpec("attention_mask", "TYPE_INT64", (-1, -1)),
        TensorSpec("position_ids", "TYPE_INT64", (-1, -1)),
        TensorSpec("past_key_values.0.key", "TYPE_FP16", (-1, 2, -1, 4)))
    assert len(engine.inputs) == 3 + 2 * 2 and len(engine.outputs) == 1 + 2 * 2
    assert engine.outputs[0] == TensorSpec("logits", "TYPE_FP32", (-1, -1, 97))
    assert [(p.index, p.phase) for p in engine.profiles] == [(0, "prefill"), (1, "decode")]
    # engine_manifest.py's profiles: prefill batch 4, seq 256; decode batch 6, past up to 1023
    prefill, decode = engine.profiles
    assert prefill.max_dim("input_ids", 0) == 4 and prefill.max_dim("input_ids", 1) == 256
    assert decode.max_dim("attention_mask", 1) == 1 + 1023
    assert decode.max_dim("no_such_input", 0) is None


def test_max_dim_is_an_int_even_when_the_manifest_wrote_a_string():
    """max_dim reads the "max" entry at the axis, as an int."""
    prof = ProfileSpec(index=0, phase="both", shapes={"input_ids": {"min": [1, 1], "opt": [2, 8], "max": ["8", 512]}})
    assert prof.max_dim("input_ids", 0) == 8 and prof.max_dim("input_ids", 1) == 512


def test_tensorrt_package_and_version_default_when_not_said(tmp_path):
    """No "tensorrt" entry: package tensorrt, version unknown; a numeric version is kept as text."""
    folder = tmp_path / "engines"
    write_engine_folder(folder)
    _rewrite(folder, lambda m: m.pop("tensorrt"))
    src = read_engine_folder(folder)
    assert (src.trt_package, src.trt_version) == ("tensorrt", "unknown")
    _rewrite(folder, lambda m: m.update(tensorrt={"version": 10}))
    src = read_engine_folder(folder)
    assert (src.trt_package, src.trt_version) == ("tensorrt", "10")
    _rewrite(folder, lambda m: m.update(tensorrt={"package": "tensorrt_rtx"}))
    assert read_engine_folder(folder).trt_package == "tensorrt_rtx"


def test_no_plugins_listed_is_no_plugins(tmp_path):
    """A manifest without "plugins" gives no plugin libraries (none required)."""
    folder = tmp_path / "engines"
    write_engine_folder(folder)
    _rewrite(folder, lambda m: m.pop("plugins"))
    assert read_engine_folder(folder).plugins == ()


def test_model_fields_from_wide_config_beside_the_manifest(tmp_path):
    """Without "model" in the manifest the model is the folder's wide_config.json."""
    folder = tmp_path / "engines"
    manifest = write_engine_folder(folder, layers=3, vocab=97, heads=2, dim=4)
    (folder / "wide_config.json").write_text(json.dumps({**manifest["model"], "max_position_embeddings": 777}))
    _rewrite(folder, lambda m: m.pop("model"))
    assert read_engine_folder(folder).shape == ModelShape(3, 2, 4, 97, "float16", 777)
    (folder / "wide_config.json").unlink()
    err = _refusal(folder)
    assert err.message.startswith(f"{folder / 'wide_config.json'} ") and "not found" in err.message


def test_two_engines_each_read(tmp_path):
    """Every engine listed is read, in the manifest's order."""
    folder = tmp_path / "engines"
    write_engine_folder(folder, layers=1)
    (folder / "second.engine").write_bytes(b"x")
    _rewrite(folder, lambda m: m["engines"].append({**m["engines"][0], "file": "second.engine"}))
    src = read_engine_folder(folder)
    assert [e.file.name for e in src.engines] == ["model.engine", "second.engine"]


# -- profiles: which phase each serves
PAST = DEFAULT_IO["past_key"].format(i=0)  # past_key_values.0.key, its axis 2 the past length


def _past(lo: int, hi: int) -> dict:
    return {PAST: {"min": [1, 2, lo, 4], "opt": [1, 2, hi, 4], "max": [1, 2, hi, 4]}}


@pytest.mark.parametrize("raw, phase", [
    ({"name": "prefill"}, "prefill"),
    ({"name": "Decode", "shapes": _past(0, 0)}, "decode"),  # the name wins over the shapes
    ({"name": "PREFILL", "shapes": _past(1, 9)}, "prefill"),
    ({"phase": "decode"}, "decode"),  # no name: the phase entry
    ({"name": "p0", "phase": "decode"}, "both"),  # a name that says nothing: not the phase entry, the shapes
    ({"name": "p0", "shapes": _past(0, 0)}, "prefill"),  # past fixed at 0
    ({"shapes": _past(1, 1023)}, "decode"),  # past never empty
    ({"shapes": _past(0, 1023)}, "both"),  # past from 0 up: either phase
    ({"shapes": {"input_ids": {"min": [1, 1], "opt": [1, 1], "max": [1, 1]}}}, "both"),  # no past input ranged
    ({}, "both"),
])
def test_profile_phase(raw, phase):
    """A profile is prefill/decode by its name, else by its past length's range (module docstring)."""
    assert engines._phase(raw, PAST) == phase


def test_an_engine_without_profiles_has_one_for_both_phases(tmp_path):
    """No (or an empty) profile list: one profile 0 serving both phases, no shape ranges."""
    folder = tmp_path / "engines"
    write_engine_folder(folder)
    spec = engines._engine({"file": "model.engine", "inputs": [], "outputs": []}, folder, "m.json")
    assert [(p.index, p.phase, p.shapes) for p in spec.profiles] == [(0, "both", {})]
    spec = engines._engine({"file": "model.engine", "profiles": []}, folder, "m.json")
    assert [(p.index, p.phase, p.shapes) for p in spec.profiles] == [(0, "both", {})]
    assert (spec.inputs, spec.outputs) == ((), ())


def test_a_profile_naming_unknown_inputs(tmp_path):
    """A profile ranging inputs the engine does not have is refused, naming its index and those inputs sorted."""
    folder = tmp_path / "engines"
    write_engine_folder(folder)
    raw = {"file": "model.engine", "inputs": [{"name": "input_ids", "dtype": "int64", "shape": [-1, -1]}],
           "profiles": [{"name": "prefill", "shapes": {"input_ids": {}}},
                        {"name": "decode", "shapes": {"zeta": {}, "input_ids": {}, "alpha": {}}}]}
    with pytest.raises(WideError) as err:
        engines._engine(raw, folder, "m.json")
    assert err.value.message.startswith("m.json: profile 1 ") and err.value.message.endswith(" ['alpha', 'zeta']")


# -- tensors
def test_tensor_dtype_names_and_dims():
    """dtype names in any case, aliases included; dims as ints (a manifest may write "4")."""
    assert engines._tensor({"name": "x", "dtype": "FP16", "shape": [-1, "4"]}, "m") == \
        TensorSpec("x", "TYPE_FP16", (-1, 4))
    assert engines._tensor({"name": "y", "dtype": "bfloat16", "shape": []}, "m") == TensorSpec("y", "TYPE_BF16", ())
    assert engines._tensor({"name": "z", "dtype": "Bool", "shape": [1]}, "m").data_type == "TYPE_BOOL"


@pytest.mark.parametrize("raw", [{"dtype": "int64", "shape": [1]}, {"name": "x", "shape": [1]},
                                 {"name": "x", "dtype": "int64"}, ["input_ids"], "input_ids"])
def test_a_tensor_missing_a_field(raw):
    """A tensor entry without name, dtype or shape (or not an object) is refused, quoting the entry."""
    with pytest.raises(WideError) as err:
        engines._tensor(raw, "m.json")
    assert err.value.message.startswith("m.json: ") and err.value.message.endswith(f"got {raw!r}")


def test_a_tensor_of_an_unsupported_dtype_is_named_as_written():
    """An unknown dtype is refused, quoted as the manifest wrote it (not lowercased)."""
    with pytest.raises(WideError) as err:
        engines._tensor({"name": "ids", "dtype": "Complex64", "shape": [1]}, "m.json")
    assert err.value.message.startswith("m.json: tensor ids ") and "'Complex64'" in err.value.message


# -- refusals of a whole folder
def test_a_folder_without_a_manifest(tmp_path):
    """A folder without wide_engine.json: its path, and where to point --engines."""
    err = _refusal(tmp_path)
    assert err.message.startswith(f"{tmp_path / 'wide_engine.json'} ") and "not found" in err.message
    assert "--engines" in err.hint and "wide-export trt" in err.hint


def test_a_manifest_that_is_not_an_object(tmp_path):
    """A manifest that is JSON but not an object is refused with the rebuild hint."""
    (tmp_path / "wide_engine.json").write_text("[1, 2]")
    err = _refusal(tmp_path)
    assert err.message.startswith(f"{tmp_path / 'wide_engine.json'}: ") and "JSON object" in err.message
    assert REBUILD in err.hint


def test_a_manifest_that_is_not_json_says_how_to_rebuild(tmp_path):
    """Unparsable JSON gets the same rebuild hint."""
    (tmp_path / "wide_engine.json").write_text("{not json")
    assert REBUILD in _refusal(tmp_path).hint


def test_a_manifest_linked_from_outside_is_refused(tmp_path):
    """A wide_engine.json symlinked to another folder's is refused, naming both paths."""
    elsewhere = tmp_path / "elsewhere"
    write_engine_folder(elsewhere)
    folder = tmp_path / "engines"
    folder.mkdir()
    (folder / "wide_engine.json").symlink_to(elsewhere / "wide_engine.json")
    err = _refusal(folder)
    assert f"{folder / 'wide_engine.json'} resolves to {elsewhere / 'wide_engine.json'}" in err.message
    assert err.message.endswith(f"outside {folder}"), err.message


@pytest.mark.parametrize("engines_entry", [[], None])
def test_a_manifest_listing_no_engines(tmp_path, engines_entry):
    """An empty or missing engine list is refused."""
    folder = tmp_path / "engines"
    write_engine_folder(folder)
    path = _rewrite(folder, lambda m: m.update(engines=engines_entry) if engines_entry is not None
                    else m.pop("engines"))
    assert _refusal(folder).message.startswith(f"{path}: no engines")


def test_an_engine_file_that_is_missing_or_outside(tmp_path):
    """An engine file that is missing, not named, or outside the folder is refused with its path."""
    folder = tmp_path / "engines"
    write_engine_folder(folder)
    path = _rewrite(folder, lambda m: m["engines"][0].update(file="gone.engine"))
    said = _refusal(folder).message
    assert said.startswith(f"{path}: ") and f" {folder / 'gone.engine'} not found" in said, said
    path = _rewrite(folder, lambda m: m["engines"][0].pop("file"))
    said = _refusal(folder).message
    assert said.startswith(f"{path}: ") and said.endswith(f" {folder} not found"), said  # the folder is no file
    (tmp_path / "outside.engine").write_bytes(b"x")
    path = _rewrite(folder, lambda m: m["engines"][0].update(file="../outside.engine"))
    said = _refusal(folder).message
    assert said.startswith(f"{path}: ") and said.endswith(f"outside {folder}"), said
    assert f"{folder / '../outside.engine'} resolves to {tmp_path / 'outside.engine'}" in said, said


def test_kv_layers_must_be_the_models(tmp_path):
    """An engine's KV-cache layer count must be the model's; both counts are named."""
    folder = tmp_path / "engines"
    write_engine_folder(folder, layers=2)
    path = _rewrite(folder, lambda m: m["model"].update(num_layers=3))
    said = _refusal(folder).message
    assert said.startswith(f"{path}: model.engine ") and "2 KV-cache layers" in said and said.endswith(" 3"), said


def test_io_names_checked_against_the_contract(tmp_path):
    """An engine lacking a contract output is refused, naming the manifest and engine file."""
    folder = tmp_path / "engines"
    write_engine_folder(folder, layers=1)
    path = _rewrite(folder, lambda m: m["engines"][0]["outputs"].pop())  # lose present.0.value
    err = _refusal(folder)
    assert err.message.startswith(f"{path} (model.engine): outputs ") and "for 1 layers" in err.message
    assert "missing ['present.0.value']" in err.message


def test_logits_width_checked_against_the_vocabulary(tmp_path):
    """An engine's static logits width must be the model's vocab_size."""
    folder = tmp_path / "engines"
    write_engine_folder(folder, vocab=97)
    path = _rewrite(folder, lambda m: m["model"].update(vocab_size=98))
    err = _refusal(folder)
    assert err.message.startswith(f"{path} (model.engine): ") and "97 values per token" in err.message
    assert "vocab_size 98" in err.message


def test_a_plugin_library_missing_or_outside(tmp_path):
    """A listed plugin library that is missing or lies outside the folder is refused with its path."""
    folder = tmp_path / "engines"
    write_engine_folder(folder)
    (folder / "libwide_plugins.so").unlink()
    path = folder / "wide_engine.json"
    said = _refusal(folder).message
    assert said.startswith(f"{path}: ") and f" {folder / 'libwide_plugins.so'} not found" in said, said
    (tmp_path / "lib.so").write_bytes(b"x")
    _rewrite(folder, lambda m: m.update(plugins=["../lib.so"]))
    said = _refusal(folder).message
    assert said.startswith(f"{path}: ") and f"{folder / '../lib.so'} resolves to {tmp_path / 'lib.so'}" in said
    assert said.endswith(f"outside {folder}"), said


def test_a_bad_tensor_is_named_with_the_manifest(tmp_path):
    """A tensor refused in an engine's inputs or outputs: the message starts with the manifest's path."""
    folder = tmp_path / "engines"
    write_engine_folder(folder)
    path = _rewrite(folder, lambda m: m["engines"][0]["inputs"][0].update(dtype="complex64"))
    said = _refusal(folder).message
    assert said.startswith(f"{path}: tensor input_ids ") and "'complex64'" in said, said
    write_engine_folder(tmp_path / "again")
    path = _rewrite(tmp_path / "again", lambda m: m["engines"][0]["outputs"][0].pop("shape"))
    said = _refusal(tmp_path / "again").message
    assert said.startswith(f"{path}: ") and "shape" in said, said


def test_a_bad_model_entry_is_named_with_the_manifest(tmp_path):
    """A bad field of the manifest's "model" entry is named with the manifest's path."""
    folder = tmp_path / "engines"
    write_engine_folder(folder)
    path = _rewrite(folder, lambda m: m["model"].update(head_dim=0))
    said = _refusal(folder).message
    assert said.startswith(f"{path}: head_dim ") and said.endswith("got 0"), said


def test_unnamed_profiles_get_their_phase_from_the_first_layers_past_length(tmp_path):
    """Profiles without names: past_key_values.0.key's range decides (prefill: fixed at 0; decode: never 0).
    One layer, so no other layer's past could stand in for layer 0's."""
    folder = tmp_path / "engines"
    write_engine_folder(folder, layers=1)
    _rewrite(folder, lambda m: [p.pop("name") for p in m["engines"][0]["profiles"]])
    (engine,) = read_engine_folder(folder).engines
    assert [(p.index, p.phase) for p in engine.profiles] == [(0, "prefill"), (1, "decode")]
