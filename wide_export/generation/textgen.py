"""Text and stop conditions for the generation model (copied as `<model>/1/textgen.py`).

Self-contained like model.py (numpy, plus the `tokenizers` library when the
repository carries `tokenizer.json`): a generated repository must run where
wide_export is not installed.

`Codec` is the model's own tokenizer (Hugging Face `tokenizers`, never a
hand-written BPE): text in (`encode`), text out (`decode`, special tokens
skipped as transformers' `decode(skip_special_tokens=True)` does).

`RowOutput` follows one row's generated tokens: it stops the row at an eos id
(unless the request says ignore_eos), at a request's stop token ids, at a stop
string, or when `max_new_tokens` is reached, and records why (`stop` or
`length`, OpenAI's finish reasons). It also turns the tokens into text
incrementally, the way vLLM's `detokenize_incrementally` does: each new token
is decoded together with a few tokens before it, and text is released only
when the decode does not end in U+FFFD, so a character whose UTF-8 bytes are
split across tokens (byte-level BPE, SentencePiece byte-fallback) comes out
whole, and SentencePiece's word-initial spaces come out as decoding the whole
sequence gives them. While the row runs, the last `len(longest stop) - 1`
characters are held back (a stop string may still be completing); a stop
string and everything after it never reach the client, nor does the text of the
eos / stop token id that ended the row (as vLLM: such an id from
generation_config.json may be an ordinary, non-special token).
"""

from __future__ import annotations

import os
from typing import Optional

import numpy as np

TOKENIZER_FILE = "tokenizer.json"
# Tokens of the prompt decoded with the first new ones, so that the first delta has the
# spacing a decode of the whole sequence gives (vLLM: INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET).
CONTEXT_TOKENS = 5
STOP = "stop"
LENGTH = "length"


class Codec:
    """The model's tokenizer (`tokenizer.json` through the `tokenizers` library)."""

    def __init__(self, path: str):
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise RuntimeError("text requests need the `tokenizers` library in the server's Python: "
                               "pip install tokenizers there") from None
        self.tokenizer = Tokenizer.from_file(path)
        self.vocab_size = self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> np.ndarray:
        ids = self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids
        return np.asarray(ids, dtype=np.int64)

    def decode(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)


def load_codec(folder: str) -> Optional[Codec]:
    """The tokenizer in `folder`, or None when the repository carries none (token ids only)."""
    path = os.path.join(folder, TOKENIZER_FILE)
    return Codec(path) if os.path.isfile(path) else None


class RowOutput:
    """One row's generated tokens, why it ended, and its text released so far."""

    def __init__(self, prompt: np.ndarray, max_new_tokens: int, stop_ids=(), stop_strings=(),
                 codec: Optional[Codec] = None):
        self.max_new_tokens = max_new_tokens
        self.stop_ids = frozenset(int(i) for i in stop_ids)
        self.stop_strings = tuple(s for s in stop_strings if s)
        self.codec = codec
        self.prompt_tokens = int(prompt.size)
        self.tokens: list[int] = []
        self.finish_reason: Optional[str] = None
        # Incremental decoding state over context + tokens (vLLM's prefix/read offsets).
        self._ids: list[int] = [int(t) for t in prompt[-CONTEXT_TOKENS:]] if codec is not None else []
        self._prefix = 0
        self._read = len(self._ids)
        self.text = ""  # all text decoded so far (cut at a stop string)
        self._released = 0  # characters of `text` handed out by take_text()

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def add(self, token: int) -> None:
        """Append the row's next token and apply the stop conditions."""
        if self.done:
            raise RuntimeError("a finished row got another token")
        token = int(token)
        self.tokens.append(token)  # counted in the usage, whatever ended the row
        if token in self.stop_ids:
            self.finish_reason = STOP
            if self.codec is not None:  # the text before it, flushed; the stop token's own text is never
                self._decode_new(final=True)  # part of the answer (as vLLM: an eos id of generation_config.json
            return  # may be an ordinary token, e.g. "\n" or "<|im_end|>" added as non-special)
        if self.codec is not None:
            self._ids.append(token)
            self._decode_new(final=self.done or len(self.tokens) >= self.max_new_tokens)
        if not self.done and len(self.tokens) >= self.max_new_tokens:
            self.finish_reason = LENGTH

    def _decode_new(self, final: bool) -> None:
        prefix = self.codec.decode(self._ids[self._prefix:self._read])
        full = self.codec.decode(self._ids[self._prefix:])
        if len(full) <= len(prefix) or (full.endswith("\ufffd") and not final):
            return  # nothing new, or a character still incomplete: wait for the next token
        new = full[len(prefix):]
        self._prefix, self._read = self._read, len(self._ids)
        searched_from = max(0, len(self.text) - max((len(s) for s in self.stop_strings), default=0) + 1)
        self.text += new
        if self.stop_strings:
            hits = [i for i in (self.text.find(s, searched_from) for s in self.stop_strings) if i >= 0]
            if hits:
                self.text = self.text[:min(hits)]
                self.finish_reason = STOP

    def take_text(self) -> str:
        """The text not handed out yet; while the row runs, what may still be the start of a
        stop string is kept back."""
        if self.codec is None:
            return ""
        end = len(self.text)
        if not self.done and self.stop_strings:
            end -= max(len(s) for s in self.stop_strings) - 1
        if end <= self._released:
            return ""
        chunk = self.text[self._released:end]
        self._released = end
        return chunk
