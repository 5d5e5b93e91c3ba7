"""What the frontend reads from a repository: its generation models and their tokenizers
(a real transformers tokenizer built here from the `tokenizers` library, no download)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.frontend.conftest import make_client
from tests.frontend.fakes import FakeEngine
from wide_export.base.errors import WideError
from wide_export.serving.openai.chat import NO_TEMPLATE, load_model_text
from wide_export.serving.openai.models import discover

TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def write_tokenizer(folder: Path, chat_template: str | None = TEMPLATE) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate("<unk> <s> </s> hello world user assistant".split())}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
              "tokenizer_class": "PreTrainedTokenizerFast"}
    if chat_template is not None:
        config["chat_template"] = chat_template
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


def write_model(repo: Path, name: str, max_total: int = 128) -> Path:
    version = repo / name / "1"
    version.mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "python"\n')
    settings = {"flavour": "onnxruntime", "num_layers": 1, "num_kv_heads": 1, "head_dim": 8, "vocab_size": 7,
                "kv_dtype": "float32", "max_total_tokens": max_total, "io": {}}  # what repository.py writes, abridged
    (version / "generation.json").write_text(json.dumps(settings))
    return version


def test_discover_serves_each_generation_model(tmp_path):
    write_model(tmp_path, "b_llm")
    write_model(tmp_path, "a_llm", 256)
    (tmp_path / "a_llm_engine" / "1").mkdir(parents=True)  # no generation.json: not served
    models = discover(tmp_path)
    assert [(m.name, m.triton_name, m.max_model_len) for m in models] == [("a_llm", "a_llm", 256),
                                                                         ("b_llm", "b_llm", 128)]
    with pytest.raises(WideError, match="names one model"):
        discover(tmp_path, "gpt")
    with pytest.raises(WideError, match="no generation model"):
        discover(tmp_path / "a_llm_engine")


def test_served_model_name_renames_the_one_model(tmp_path):
    write_model(tmp_path, "wide_llm")
    [model] = discover(tmp_path, "my-model")
    assert (model.name, model.triton_name) == ("my-model", "wide_llm")


def test_chat_template_through_transformers(tmp_path):
    write_tokenizer(tmp_path)
    text = load_model_text(tmp_path)
    assert text.has_tokenizer and text.has_chat_template
    prompt = text.render_chat([{"role": "user", "content": "hello"}])
    assert prompt == "<s><|user|>hello\n<|assistant|>"


def test_no_template_and_no_tokenizer(tmp_path):
    write_tokenizer(tmp_path / "plain", chat_template=None)
    plain = load_model_text(tmp_path / "plain")
    assert plain.has_tokenizer and not plain.has_chat_template
    with pytest.raises(Exception, match=NO_TEMPLATE):
        plain.render_chat([{"role": "user", "content": "hello"}])
    (tmp_path / "none").mkdir()
    missing = load_model_text(tmp_path / "none")
    assert not missing.has_tokenizer and "no tokenizer" in missing.missing


def test_damaged_tokenizer_is_one_line_error(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(WideError, match="cannot load the tokenizer") as err:
        load_model_text(tmp_path)
    assert "\n" not in err.value.message


def test_template_errors_are_400(tmp_path):
    write_tokenizer(tmp_path, chat_template="{{ raise_exception('roles must alternate') }}")
    from wide_export.serving.openai.models import ServedModel

    model = ServedModel("m", "m", tmp_path, text=load_model_text(tmp_path))
    with make_client(FakeEngine(names=["m"]), [model]) as client:
        resp = client.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
    assert resp.status_code == 400 and "roles must alternate" in resp.json()["error"]["message"]


def test_prepare_frontend_loads_the_repository(tmp_path):
    from wide_export.serving.openai.runner import prepare_frontend

    write_tokenizer(write_model(tmp_path, "wide_llm"))
    frontend = prepare_frontend(tmp_path, port=0)
    try:
        [model] = frontend.models
        assert model.text.has_chat_template and frontend.url.startswith("http://127.0.0.1:")
    finally:
        frontend.stop()
