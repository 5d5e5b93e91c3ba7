"""serving/openai/models.py: which models a repository serves under which names, and what each refusal names."""

from __future__ import annotations

import pytest

from tests.frontend.test_repository import write_model
from wide_export.base.errors import WideError
from wide_export.serving.openai.models import ServedModel, discover


def test_an_empty_repository_says_what_it_lacks(tmp_path):
    (tmp_path / "not_a_model" / "1").mkdir(parents=True)
    with pytest.raises(WideError) as err:
        discover(tmp_path)
    assert err.value.message.startswith(f"{tmp_path} ") and "*/1/generation.json" in err.value.message
    assert "wide-export triton" in err.value.hint


def test_served_model_name_refusals(tmp_path):
    write_model(tmp_path, "a_llm")
    with pytest.raises(WideError) as err:
        discover(tmp_path, "  ")
    assert err.value.message.startswith("--served-model-name ") and "empty" in err.value.message
    write_model(tmp_path, "b_llm")
    with pytest.raises(WideError) as err:
        discover(tmp_path, "x")
    msg = err.value.message
    assert msg.startswith("--served-model-name ") and f"{tmp_path} has 2 " in msg and msg.endswith("(a_llm, b_llm)")
    assert "--served-model-name" in err.value.hint


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
    assert "no tokenizer" in model.text.missing and not model.text.has_tokenizer
