"""textgen.py (the repository's tokenizer, stop rules and streamed text) against the tokenizers
library's own decode of the whole sequence, with real tokenizers: the demo's byte-level one and a
SentencePiece-style one with byte fallback (Llama 2's decoder chain)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.triton.support import load_generation_module

TEXTS = ["héllo wörld", "日本語のテキスト", "emoji 🙂 and 🚀 mixed in", "a\u00a0b ünïcödé ç", "plain ascii"]


@pytest.fixture(scope="module")
def textgen(tmp_path_factory):
    from wide_export.tritonserver import repository

    folder = tmp_path_factory.mktemp("textgen")
    repository.write_model_files(folder)
    return load_generation_module(folder).load_sibling("textgen")


@pytest.fixture(scope="module")
def byte_level(tmp_path_factory, textgen):
    from wide_export.model.demo_tokenizer import write_demo_tokenizer

    folder = tmp_path_factory.mktemp("bytes")
    write_demo_tokenizer(folder)
    return textgen.load_codec(str(folder))


@pytest.fixture(scope="module")
def sentencepiece(tmp_path_factory, textgen):
    """Metaspace pre-tokenizer, BPE with byte fallback (<0xXX> tokens), Llama 2's decoders."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    for piece in ["▁", "▁a", "▁b", "▁and", "▁in", "▁mixed", "▁plain", "▁ascii", "▁emoji", "h", "l", "o", "w", "r", "d", "e", "m", "x", "i", "n", "p", "a", "s", "c", "t"]:
        vocab.setdefault(piece, len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    folder = tmp_path_factory.mktemp("sp")
    tok.save(str(folder / "tokenizer.json"))
    return textgen.load_codec(str(folder))


def _stream(textgen, codec, prompt, tokens, **kw):
    out = textgen.RowOutput(np.asarray(prompt, np.int64), kw.pop("max_new_tokens", len(tokens) + 5),
                            codec=codec, **kw)
    pieces = []
    for t in tokens:
        out.add(t)
        pieces.append(out.take_text())
        if out.done:
            break
    return out, pieces


@pytest.mark.parametrize("text", TEXTS)
def test_byte_level_stream_equals_the_decode_of_all_tokens(textgen, byte_level, text):
    prompt = byte_level.encode("Say: ")
    tokens = byte_level.encode(text, add_special_tokens=False)
    assert len(tokens) > len(text) or text.isascii()  # multi-byte characters are split across tokens
    out, pieces = _stream(textgen, byte_level, prompt, tokens)
    assert "".join(pieces) == byte_level.tokenizer.decode(list(tokens)) == text
    assert all("\ufffd" not in p for p in pieces)  # no half character was ever sent
    assert out.finish_reason is None


@pytest.mark.parametrize("text", TEXTS)
def test_sentencepiece_byte_fallback_stream_equals_the_decode_of_the_whole_sequence(textgen, sentencepiece, text):
    tok = sentencepiece.tokenizer
    prompt = np.array(tok.encode("plain ascii").ids)
    tokens = np.array(tok.encode(text, add_special_tokens=False).ids)
    assert any(tok.id_to_token(int(t)).startswith("<0x") for t in tokens) or text.isascii()
    _, pieces = _stream(textgen, sentencepiece, prompt, tokens)
    whole = tok.decode(list(prompt) + list(tokens))
    # The continuation keeps the space SentencePiece puts in front of its first word.
    assert "".join(pieces) == whole[len(tok.decode(list(prompt))):]
    assert all("\ufffd" not in p for p in pieces)


def test_a_stop_string_across_tokens_cuts_the_text_and_nothing_of_it_leaks(textgen, byte_level):
    tokens = byte_level.encode("one two ST", add_special_tokens=False).tolist() + \
        byte_level.encode("OP three", add_special_tokens=False).tolist()
    out, pieces = _stream(textgen, byte_level, [1], tokens, stop_strings=("STOP", "never"))
    assert out.finish_reason == "stop"
    assert "".join(pieces) == "one two "
    assert byte_level.tokenizer.decode(out.tokens) == "one two STOP"  # the ids run to the token completing it
    assert len(out.tokens) == len(byte_level.encode("one two STOP", add_special_tokens=False))


def test_eos_and_stop_ids_end_the_row_and_special_tokens_have_no_text(textgen, byte_level):
    tokens = byte_level.encode("abc", add_special_tokens=False).tolist() + [2] + [100, 101]
    out, pieces = _stream(textgen, byte_level, [1], tokens, stop_ids=(2,))
    assert (out.finish_reason, out.tokens, "".join(pieces)) == ("stop", tokens[:4], "abc")
    out, _ = _stream(textgen, byte_level, [1], tokens, stop_ids=(201, 101))
    assert out.finish_reason == "stop" and out.tokens == tokens  # 101 is the last


def test_max_new_tokens_ends_with_length_and_flushes_a_half_character(textgen, byte_level):
    tokens = byte_level.encode("ab日", add_special_tokens=False).tolist()  # 'a' 'b' + 3 bytes
    out, pieces = _stream(textgen, byte_level, [1], tokens, max_new_tokens=3)
    assert out.finish_reason == "length" and len(out.tokens) == 3
    assert "".join(pieces) == byte_level.tokenizer.decode(tokens[:3])  # 'ab' + U+FFFD, as decode gives it
    out, pieces = _stream(textgen, None, [1], [5, 6], max_new_tokens=2)
    assert out.finish_reason == "length" and pieces == ["", ""]  # no tokenizer: ids only


def test_held_back_text_is_released_when_it_cannot_start_a_stop_string(textgen, byte_level):
    tokens = byte_level.encode("xyz", add_special_tokens=False).tolist()
    out, pieces = _stream(textgen, byte_level, [1], tokens, stop_strings=("abc",))
    assert pieces == ["", "", "x"]  # two characters held back while 'abc' could still follow
    assert out.finish_reason is None


@pytest.mark.parametrize("final_char", ["\n", "Z"])
def test_the_text_of_an_ordinary_token_that_ended_the_row_is_not_in_the_answer(textgen, byte_level, final_char):
    """An eos id named in generation_config.json that is an ordinary token (a byte here, as
    "<|im_end|>" added without special=True would be) ended the row and its text was in the answer; vLLM
    leaves it out. The token still counts (usage unchanged)."""
    stop, = byte_level.encode(final_char, add_special_tokens=False).tolist()
    tokens = byte_level.encode("ab日", add_special_tokens=False).tolist()[:4] + [stop, 100]  # 'a' 'b' + 2 of 3 bytes
    out, pieces = _stream(textgen, byte_level, [1], tokens, stop_ids=(stop,))
    assert out.finish_reason == "stop" and out.tokens == tokens[:5]
    assert "".join(pieces) == byte_level.tokenizer.decode(tokens[:4])  # 'ab' + the half character, flushed
    assert final_char not in "".join(pieces)
