"""Size checks before any work: a request that cannot fit the model's context is a 400
before it is templated, tokenized or sent, so an oversized one costs nothing but its parse.

A text prompt can hold at most `max_model_len` tokens, and one token covers at most as many characters as
the vocabulary's longest token string (`ModelText.max_token_chars`: a byte-level token of k bytes is k
characters of its table, a text character at least one byte): a text longer than their product cannot
fit, whatever the tokenizer does with it. Token-id prompts and message lists are counted directly (a chat
template gives every message at least one token).
"""

from __future__ import annotations

from typing import Optional, Sequence

from wide_export.serving.openai.errors import bad_request


def check_ids(ids: Sequence[int], max_model_len: Optional[int], param: str = "prompt") -> None:
    if max_model_len is not None and len(ids) > max_model_len:
        raise bad_request(f"the prompt has {len(ids)} tokens and this model's context is {max_model_len}",
                          param=param, code="context_length_exceeded")


def max_chars(max_model_len: Optional[int], max_token_chars: Optional[int]) -> Optional[int]:
    if max_model_len is None or not max_token_chars:
        return None
    return max_model_len * max_token_chars


def check_text(chars: int, max_model_len: Optional[int], max_token_chars: Optional[int],
               param: str = "prompt") -> None:
    limit = max_chars(max_model_len, max_token_chars)
    if limit is not None and chars > limit:
        raise bad_request(f"the prompt has {chars} characters, more than this model's context of {max_model_len} "
                          f"tokens can hold (at most {max_token_chars} characters a token)",
                          param=param, code="context_length_exceeded")


def check_messages(messages: Sequence[dict], max_model_len: Optional[int], max_token_chars: Optional[int]) -> None:
    if max_model_len is not None and len(messages) > max_model_len:
        raise bad_request(f"{len(messages)} messages cannot fit this model's context of {max_model_len} tokens",
                          param="messages", code="context_length_exceeded")
    chars = sum(len(m.get("content") or "") + len(m.get("name") or "") for m in messages)
    check_text(chars, max_model_len, max_token_chars, param="messages")
