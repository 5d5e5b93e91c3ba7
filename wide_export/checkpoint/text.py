"""The model folder's tokenizer and the text cut into windows of token ids."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from wide_export.errors import WideError

TOKENIZER_FILE = "tokenizer.json"
SLOW_TOKENIZER_FILES = ("tokenizer.model", "vocab.json", "tokenizer_config.json")


def load_tokenizer(model_dir: Path) -> Callable[[str], list[int]]:
    """text -> ids with the folder's tokenizer (special tokens, e.g. BOS, added as the tokenizer says)."""
    return load_codec(model_dir)[0]


def load_codec(model_dir: Path) -> tuple[Callable[[str], list[int]], Callable[[list[int]], str]]:
    """(encode, decode) with the folder's tokenizer: text -> ids (special tokens added as the tokenizer says),
    ids -> text (special tokens left out)."""
    model_dir = Path(model_dir)
    fast = model_dir / TOKENIZER_FILE
    if fast.is_file():
        from tokenizers import Tokenizer

        try:
            tok = Tokenizer.from_file(str(fast))
        except Exception as err:  # the tokenizers library raises a bare Exception on bad JSON
            raise WideError(f"cannot read {fast}: {str(err).splitlines()[0][:160]}",
                            "the tokenizer file looks damaged; save it again with save_pretrained") from None
        return (lambda text: tok.encode(text).ids), (lambda ids: tok.decode(ids, skip_special_tokens=True))
    if any((model_dir / f).is_file() for f in SLOW_TOKENIZER_FILES):
        from transformers import AutoTokenizer

        try:
            tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
        except Exception as err:  # noqa: BLE001 - any failure here means "no usable tokenizer"
            raise WideError(f"cannot load the tokenizer of {model_dir}: {str(err).splitlines()[0][:160]}",
                            f"put the model's {TOKENIZER_FILE} in the folder") from None
        return (lambda text: list(tok(text)["input_ids"])), (lambda ids: tok.decode(ids, skip_special_tokens=True))
    raise WideError(f"{model_dir} has no tokenizer ({TOKENIZER_FILE})",
                    "copy the model's tokenizer files next to config.json "
                    "(AutoTokenizer.from_pretrained(NAME).save_pretrained(DIR))")


def read_text(path: Path) -> str:
    path = Path(path)
    if not path.is_file():
        raise WideError(f"text file not found: {path}", "pass --text FILE, a UTF-8 text file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise WideError(f"{path} is not UTF-8 text ({err.reason} at byte {err.start})",
                        "pass a plain UTF-8 text file") from None
    if not text.strip():
        raise WideError(f"{path} is empty", "pass a file with some text to evaluate on (a few paragraphs at least)")
    return text


def windows(ids: list[int], window: int) -> list[list[int]]:
    """Consecutive, non-overlapping windows; a last window of fewer than 2 tokens predicts nothing: dropped."""
    out = [ids[i:i + window] for i in range(0, len(ids), window)]
    return [w for w in out if len(w) >= 2]
