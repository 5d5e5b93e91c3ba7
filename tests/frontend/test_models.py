"""frontend/models.py: which models a repository serves under which names, and the refusals' exact words."""

from __future__ import annotations

import pytest

from tests.frontend.test_repository import write_model
from wide_export.errors import WideError
from wide_export.frontend.models import ServedModel, discover


def test_an_empty_repository_says_what_it_lacks(tmp_path):
    (tmp_path / "not_a_model" / "1").mkdir(parents=True)
    with pytest.raises(WideError) as err:
        discover(tmp_path)
    assert err.value.message == f"{tmp_path} holds no generation model (no */1/generation.json)"
    assert err.value.hint == "generate the repository with `wide-export triton`"


def test_served_model_name_refusals(tmp_path):
    write_model(tmp_path, "a_llm")
    with pytest.raises(WideError) as err:
        discover(tmp_path, "  ")
    assert err.value.message == "--served-model-name must not be empty" and err.value.hint is None
    write_model(tmp_path, "b_llm")
    with pytest.raises(WideError) as err:
        discover(tmp_path, "x")
    assert err.value.message == (f"--served-model-name names one model, and {tmp_path} has 2 generation models "
                                 "(a_llm, b_llm)")
    assert err.value.hint == "drop --served-model-name to serve each under its own name"


def test_length_limit_from_generation_json_or_none(tmp_path):
    write_model(tmp_path, "a_llm", max_total=96)
    (write_model(tmp_path, "b_llm") / "generation.json").write_text('{"vocab_size": 7}')
    (write_model(tmp_path, "c_llm") / "generation.json").write_text("{broken")
    (write_model(tmp_path, "d_llm") / "generation.json").write_text('{"max_total_tokens": "many"}')
    models = discover(tmp_path)
    assert [(m.name, m.triton_name, m.max_model_len) for m in models] == [
        ("a_llm", "a_llm", 96), ("b_llm", "b_llm", None), ("c_llm", "c_llm", None), ("d_llm", "d_llm", None)]
    assert models[0].folder == tmp_path / "a_llm" / "1"


def test_a_model_without_a_folder_has_no_tokenizer():
    model = ServedModel(name="m", triton_name="m")
    model.load_text()
    assert model.text.missing == "this model has no tokenizer" and not model.text.has_tokenizer
