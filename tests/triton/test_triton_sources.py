"""tritonserver/export_folder.py's read_onnx_folder on copies of the tiny contract model (tests/triton/tiny_llm.py):
what it returns and each refusal's exact message and hint, written out here from tiny_llm's constants."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import onnx
import pytest

from tests.triton import tiny_llm
from wide_export.base.errors import WideError
from wide_export.tritonserver.export_folder import DEFAULT_IO, ModelShape, OnnxSource, read_model_shape, read_onnx_folder

REEXPORT = "re-export"  # what the mixed-files hint says to do


@pytest.fixture
def folder(tiny, tmp_path) -> Path:
    """A copy of the tiny model's folder (model.onnx, wide_config.json) to damage."""
    return Path(shutil.copytree(tiny[0], tmp_path / "onnx"))


def _edit_config(folder: Path, **fields) -> Path:
    path = folder / "wide_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))
    return path


def _refusal(folder: Path) -> WideError:
    with pytest.raises(WideError) as err:
        read_onnx_folder(folder)
    return err.value


def test_the_tiny_model_read(folder):
    """Inline weights (no data files), the shape from wide_config.json, the default I/O names."""
    assert read_onnx_folder(folder) == OnnxSource(
        folder=folder, onnx_file=folder / "model.onnx", data_files=(),
        shape=ModelShape(num_layers=tiny_llm.LAYERS, num_kv_heads=tiny_llm.KV_HEADS, head_dim=tiny_llm.HEAD_DIM,
                         vocab_size=tiny_llm.VOCAB, kv_dtype="float32", max_position_embeddings=tiny_llm.MAX_POS),
        io=DEFAULT_IO)


def test_external_weights_are_listed(folder):
    """Weights saved beside the graph (external data) are listed as the source's data files."""
    model = onnx.load(str(folder / "model.onnx"))
    onnx.save(model, str(folder / "model.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
              location="weights.bin", size_threshold=0)
    assert read_onnx_folder(folder).data_files == (folder / "weights.bin",)


def test_a_folder_without_model_onnx(tmp_path):
    """A folder without model.onnx: its path, and where to point --onnx."""
    err = _refusal(tmp_path)
    assert err.message.startswith(f"{tmp_path / 'model.onnx'} ") and "not found" in err.message
    assert "--onnx" in err.hint and "wide-export onnx" in err.hint


def test_model_onnx_linked_from_outside(folder, tmp_path):
    """A model.onnx symlinked from outside the folder is refused, naming both paths."""
    outside = tmp_path / "outside.onnx"
    (folder / "model.onnx").rename(outside)
    (folder / "model.onnx").symlink_to(outside)
    said = _refusal(folder).message
    assert f"{folder / 'model.onnx'} resolves to {outside}" in said and said.endswith(f"outside {folder}"), said


def test_a_folder_without_wide_config(folder):
    """A graph without wide_config.json beside it: the missing path and where to point."""
    (folder / "wide_config.json").unlink()
    err = _refusal(folder)
    assert err.message.startswith(f"{folder / 'wide_config.json'} ") and "not found" in err.message
    assert "wide-export onnx" in err.hint


def test_wide_config_linked_from_outside(folder, tmp_path):
    """A wide_config.json symlinked from outside the folder is refused, naming both paths."""
    outside = tmp_path / "cfg.json"
    (folder / "wide_config.json").rename(outside)
    (folder / "wide_config.json").symlink_to(outside)
    said = _refusal(folder).message
    assert f"{folder / 'wide_config.json'} resolves to {outside}" in said and said.endswith(f"outside {folder}"), said


def test_a_damaged_wide_config_says_to_re_export(folder):
    """Unparsable wide_config.json gets the re-export hint."""
    (folder / "wide_config.json").write_text("{")
    assert "wide-export onnx" in _refusal(folder).hint


def test_more_layers_in_the_config_than_in_the_graph(folder):
    """A config claiming a layer the graph lacks: the graph's path and the missing KV inputs."""
    _edit_config(folder, num_layers=tiny_llm.LAYERS + 1)
    n = tiny_llm.LAYERS
    err = _refusal(folder)
    assert err.message.startswith(f"{folder / 'model.onnx'}: inputs ") and f"for {n + 1} layers" in err.message
    assert f"missing ['past_key_values.{n}.key', 'past_key_values.{n}.value']" in err.message


def test_a_vocabulary_other_than_the_logits_width(folder):
    """A vocab_size other than the graph's logits width is refused with both numbers."""
    _edit_config(folder, vocab_size=tiny_llm.VOCAB + 1)
    err = _refusal(folder)
    assert err.message.startswith(f"{folder / 'model.onnx'}: ") and f"{tiny_llm.VOCAB} values per token" in err.message
    assert f"vocab_size {tiny_llm.VOCAB + 1}" in err.message and REEXPORT in err.hint


def test_config_io_listing_other_inputs_than_the_graph(folder):
    """wide_config.json's io listing must name the graph's own inputs and outputs."""
    path = _edit_config(folder, io={"inputs": [{"name": "input_ids"}], "outputs": []})
    err = _refusal(folder)
    assert err.message.startswith(f"{path}: io.inputs ") and REEXPORT in err.hint
    model = onnx.load(str(folder / "model.onnx"))
    listed = {kind: [{"name": v.name} for v in getattr(model.graph, kind[:-1])] for kind in ("inputs", "outputs")}
    _edit_config(folder, io=listed)  # the graph's own I/O, listed: agrees
    assert read_onnx_folder(folder).io == DEFAULT_IO


def test_a_bad_field_is_named_with_the_folders_wide_config(folder):
    """A bad field is named with the folder's wide_config.json path."""
    path = _edit_config(folder, head_dim=0)
    said = _refusal(folder).message
    assert said.startswith(f"{path}: head_dim ") and said.endswith("got 0"), said


def test_read_model_shape_of_a_wide_config_file(folder):
    """The file's fields as a ModelShape; its errors name the file, a missing one says where to point."""
    path = _edit_config(folder, num_layers=3, dtype="fp16", max_position_embeddings=128)
    assert read_model_shape(path) == ModelShape(3, tiny_llm.KV_HEADS, tiny_llm.HEAD_DIM, tiny_llm.VOCAB, "float16",
                                                128)
    _edit_config(folder, vocab_size=-5)
    with pytest.raises(WideError) as err:
        read_model_shape(path)
    assert err.value.message.startswith(f"{path}: vocab_size ") and err.value.message.endswith("got -5")
    with pytest.raises(WideError) as err:
        read_model_shape(folder / "other.json")
    assert err.value.message.startswith(f"{folder / 'other.json'} ") and "not found" in err.value.message
