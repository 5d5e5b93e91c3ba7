"""The model's tokenizer in the frontend: only to render chat messages with the model's chat template.

Prompts are tokenized by the model itself (its `text_input`); the frontend renders
`messages` to one prompt string with `apply_chat_template(..., tokenize=False,
add_generation_prompt=True)` of transformers' tokenizer for the repository's
`<model>/1/` folder (local files only, never remote code), loaded once when the
frontend starts. Chat prompts are then sent with `add_special_tokens=false`: the
template already holds the BOS token.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from wide_export.base.errors import WideError
from wide_export.serving.openai.errors import OpenAIError, bad_request

TOKENIZER_FILE = "tokenizer.json"
NO_TEMPLATE = "this model has no chat template; use /v1/completions"


class ModelText:
    """A served model's text side: whether it takes text, and its chat template."""

    def __init__(self, tokenizer=None, missing: Optional[str] = None):
        self.tokenizer = tokenizer
        self.missing = missing  # why text is refused (no tokenizer), else None

    @property
    def max_token_chars(self) -> Optional[int]:
        """The longest token string of the vocabulary, added tokens included (sizes.py); None without one."""
        if self.tokenizer is None:
            return None
        if getattr(self, "_max_token_chars", None) is None:
            try:
                self._max_token_chars = max(len(t) for t in self.tokenizer.get_vocab()) or None
            except Exception:  # noqa: BLE001 - a tokenizer without a vocabulary: no bound
                self._max_token_chars = None
        return self._max_token_chars

    @property
    def has_tokenizer(self) -> bool:
        return self.tokenizer is not None

    @property
    def has_chat_template(self) -> bool:
        return self.tokenizer is not None and getattr(self.tokenizer, "chat_template", None) is not None

    def require_text(self, param: str = "prompt") -> None:
        """OpenAIError 400 when the model cannot take text (no tokenizer in the repository)."""
        if self.missing is not None:
            raise bad_request(self.missing, param=param)

    def render_chat(self, messages: list[dict]) -> str:
        """The prompt for `messages` (OpenAIError 400 without a template or when the template refuses them)."""
        self.require_text("messages")
        if not self.has_chat_template:
            raise bad_request(NO_TEMPLATE, param="messages")
        try:
            prompt = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except OpenAIError:
            raise
        except Exception as err:  # noqa: BLE001 - jinja's raise_exception() and template errors
            raise bad_request(f"the chat template refused the messages: {err}", param="messages") from None
        if not isinstance(prompt, str):  # some versions return a list for batched input
            prompt = prompt[0]
        return prompt


def load_model_text(folder: Path) -> ModelText:
    """The tokenizer in a repository's `<model>/1/` folder; a ModelText saying why when there is none."""
    folder = Path(folder)
    if not (folder / TOKENIZER_FILE).is_file():
        return ModelText(missing=f"this model's repository has no tokenizer ({folder.parent.name}/{folder.name}/"
                                 f"{TOKENIZER_FILE}): only token-id prompts to /v1/completions are served")
    try:
        from transformers import AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)
    except Exception as err:  # noqa: BLE001 - a tokenizer that does not load is the user's file problem
        first = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
        raise WideError(f"cannot load the tokenizer in {folder}: {first}",
                        hint="the repository's tokenizer files are damaged; regenerate it with `wide-export triton`"
                        ) from None
    return ModelText(tokenizer)
