"""serving/openai/chat.py on stand-in tokenizers: when text is refused and why, what the template is asked,
how its failures become 400s naming `messages`, and the words of each refusal."""

from __future__ import annotations

import pytest

from wide_export.base.errors import WideError
from wide_export.serving.openai.chat import NO_TEMPLATE, ModelText, load_model_text
from wide_export.serving.openai.errors import OpenAIError, bad_request


class Tok:
    def __init__(self, answer=None, error=None, chat_template="t"):
        self.answer, self.error, self.chat_template, self.calls = answer, error, chat_template, []

    def apply_chat_template(self, messages, **kw):
        self.calls.append((messages, kw))
        if self.error is not None:
            raise self.error
        return self.answer


MESSAGES = [{"role": "user", "content": "hi"}]


def test_properties():
    assert not ModelText().has_tokenizer and not ModelText().has_chat_template
    assert ModelText(Tok()).has_tokenizer and ModelText(Tok()).has_chat_template
    assert not ModelText(Tok(chat_template=None)).has_chat_template
    assert not ModelText(object()).has_chat_template  # a tokenizer without the attribute


def test_require_text_names_the_param_and_reason():
    ModelText(Tok()).require_text()
    with pytest.raises(OpenAIError) as err:
        ModelText(missing="no tokenizer here").require_text("prompt")
    assert (err.value.status, err.value.message, err.value.param) == (400, "no tokenizer here", "prompt")
    with pytest.raises(OpenAIError) as err:
        ModelText(missing="why").require_text()
    assert err.value.param == "prompt"


def test_render_asks_for_text_with_the_generation_prompt():
    tok = Tok(answer="<prompt>")
    assert ModelText(tok).render_chat(MESSAGES) == "<prompt>"
    assert tok.calls == [(MESSAGES, {"tokenize": False, "add_generation_prompt": True})]
    assert ModelText(Tok(answer=["<first>", "<second>"])).render_chat(MESSAGES) == "<first>"


def test_render_refusals():
    with pytest.raises(OpenAIError) as err:
        ModelText(missing="no tokenizer").render_chat(MESSAGES)
    assert (err.value.message, err.value.param) == ("no tokenizer", "messages")
    with pytest.raises(OpenAIError) as err:
        ModelText(Tok(chat_template=None)).render_chat(MESSAGES)
    assert (err.value.status, err.value.message, err.value.param) == (400, NO_TEMPLATE, "messages")
    assert NO_TEMPLATE == "this model has no chat template; use /v1/completions"
    with pytest.raises(OpenAIError) as err:
        ModelText(Tok(error=ValueError("roles must alternate"))).render_chat(MESSAGES)
    assert err.value.param == "messages" and err.value.message.endswith(": roles must alternate")
    assert "chat template" in err.value.message
    assert err.value.__cause__ is None and err.value.__suppress_context__
    own = bad_request("already in OpenAI's shape", param="x")
    with pytest.raises(OpenAIError) as err:
        ModelText(Tok(error=own)).render_chat(MESSAGES)
    assert err.value is own


def test_a_folder_without_tokenizer_json(tmp_path):
    folder = tmp_path / "wide_llm" / "1"
    folder.mkdir(parents=True)
    text = load_model_text(folder)
    assert text.tokenizer is None
    assert "no tokenizer" in text.missing and "(wide_llm/1/tokenizer.json)" in text.missing  # the file it lacks


def test_a_damaged_tokenizer_names_the_folder_and_the_first_line(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(WideError) as err:
        load_model_text(tmp_path)
    assert err.value.message.startswith(f"cannot load the tokenizer in {tmp_path}: ")
    assert "\n" not in err.value.message and len(err.value.message) <= len(f"cannot load the tokenizer in {tmp_path}: ") + 200
    assert "wide-export triton" in err.value.hint


def test_a_loader_error_without_text_is_named_by_its_type(tmp_path, monkeypatch):
    import transformers

    (tmp_path / "tokenizer.json").write_text("{}")

    def fail(*a, **kw):
        raise RuntimeError("")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", fail)
    with pytest.raises(WideError) as err:
        load_model_text(tmp_path)
    assert f" {tmp_path}: " in err.value.message and err.value.message.endswith(": RuntimeError")


def test_the_tokenizer_is_loaded_locally_without_remote_code(tmp_path, monkeypatch):
    import transformers

    (tmp_path / "tokenizer.json").write_text("{}")
    seen = {}
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained",
                        lambda path, **kw: seen.update(path=path, **kw) or Tok())
    text = load_model_text(tmp_path)
    assert seen == {"path": str(tmp_path), "local_files_only": True, "trust_remote_code": False}
    assert text.has_tokenizer and text.missing is None
