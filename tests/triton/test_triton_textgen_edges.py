"""textgen.py edges (mutation testing): a stop string at the very start of the output or
completed by the last character of a token, the codec's ids, special tokens and vocabulary size,
a repository without tokenizer.json, and the exact messages an operator reads."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from tests.triton.test_triton_textgen import byte_level, sentencepiece, textgen  # noqa: F401 - fixtures


def _row(textgen, codec, prompt_text, **kw):
    return textgen.RowOutput(codec.encode(prompt_text, False), kw.pop("max_new_tokens", 50), codec=codec, **kw)


def _feed(out, codec, text):
    for t in codec.encode(text, False):
        if out.done:
            break
        out.add(t)
    return out


@pytest.mark.parametrize("generated, stop, text, other", [
    ("abcdef", "ab", "", "zzzzzz"),  # the very first characters
    ("xabcdef", "abc", "x", "zzz"),  # the stop string's last character comes with a later token
    ("xyabcdef", "abc", "xy", "zz"),
    ("a", "a", "", "z"),
])
def test_stop_strings_found_wherever_they_complete(textgen, byte_level, generated, stop, text, other):
    out = _feed(_row(textgen, byte_level, "q: ", stop_strings=(stop, other)), byte_level, generated)
    assert out.finish_reason == "stop" and out.text == text and out.take_text() == text
    assert len(out.tokens) == generated.index(stop) + len(stop)


def test_a_token_holding_a_stop_string_twice_is_cut_at_the_first(textgen, sentencepiece):
    """One token's text can hold a stop string more than once: the text ends before the first."""
    ascii_piece = sentencepiece.tokenizer.token_to_id("\u2581ascii")
    out = textgen.RowOutput(sentencepiece.encode("plain", False), 10, stop_strings=("i",), codec=sentencepiece)
    out.add(ascii_piece)
    assert out.finish_reason == "stop" and out.text.rstrip().endswith("asc") and "i" not in out.text


def test_a_finished_row_refuses_more_tokens(textgen, byte_level):
    out = _feed(_row(textgen, byte_level, "q", max_new_tokens=1), byte_level, "a")
    with pytest.raises(RuntimeError, match="finished row"):
        out.add(5)


def test_prompt_tokens_and_codec_ids(textgen, byte_level, sentencepiece, tmp_path):
    out = _row(textgen, byte_level, "a longer prompt than five tokens")
    assert out.prompt_tokens == len(byte_level.encode("a longer prompt than five tokens", False))
    ids = byte_level.encode("héllo", False)
    assert ids.dtype == np.int64 and byte_level.decode(ids) == "héllo"
    special = [1, *sentencepiece.encode("and", False).tolist(), 2]  # <s> ... </s>
    assert sentencepiece.decode(special) == "and"  # special tokens skipped
    assert sentencepiece.vocab_size == sentencepiece.tokenizer.get_vocab_size(with_added_tokens=True)
    assert textgen.load_codec(str(tmp_path)) is None  # no tokenizer.json: token ids only


def test_codec_without_tokenizers_names_the_fix(textgen, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    with pytest.raises(RuntimeError, match="`tokenizers`.*pip install tokenizers"):
        textgen.Codec(str(tmp_path / "tokenizer.json"))
