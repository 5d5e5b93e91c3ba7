"""The model folder's tokenizer and the text cut into windows of token ids."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from wide_export.base.errors import WideError

TOKENIZER_FILE = "tokenizer.json"
SLOW_TOKENIZER_FILES = ("tokenizer.model", "vocab.json", "tokenizer_config.json")
VOCABULARY_FILES = ("tokenizer.model", "vocab.json")  # the slow files that carry a vocabulary


def load_tokenizer(model_dir: Path) -> Callable[[str], list[int]]:
    """text -> ids with the folder's tokenizer (special tokens, e.g. BOS, added as the tokenizer says)."""
    return load_codec(model_dir)[0]


Codec = tuple[Callable[[str], list[int]], Callable[[list[int]], str]]


def load_codec(model_dir: Path) -> Codec:
    """(encode, decode) with the folder's tokenizer: text -> ids (special tokens added as the tokenizer says;
    encode(text, add_special_tokens=False) adds none: a chat template's text already holds its BOS),
    ids -> text (special tokens left out). A folder without one is a WideError (see find_codec)."""
    codec = find_codec(model_dir)
    if codec is None:
        raise WideError(f"{model_dir} has no tokenizer ({TOKENIZER_FILE})",
                        "copy the model's tokenizer files next to config.json "
                        "(AutoTokenizer.from_pretrained(NAME).save_pretrained(DIR))")
    return codec


def find_codec(model_dir: Path) -> Optional[Codec]:
    """load_codec's (encode, decode), or None where the folder has no tokenizer file (token ids only). A
    tokenizer file that is there but unreadable, not JSON or refused by the tokenizers library is a WideError
    naming it, never taken for "no tokenizer"."""
    model_dir = Path(model_dir)
    fast = model_dir / TOKENIZER_FILE
    if fast.is_file():
        tok = read_fast_tokenizer(fast)
        return (lambda text, add_special_tokens=True: tok.encode(text, add_special_tokens=add_special_tokens).ids), \
            (lambda ids: tok.decode(ids, skip_special_tokens=True))
    present = [f for f in SLOW_TOKENIZER_FILES if (model_dir / f).is_file()]
    if not any(f in VOCABULARY_FILES for f in present):
        return None  # tokenizer_config.json alone holds no vocabulary: no tokenizer
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    except Exception as err:  # noqa: BLE001 - any failure here means a damaged tokenizer
        raise WideError(f"cannot load the tokenizer of {model_dir} ({', '.join(present)}): "
                        f"{_first_line(err)}", f"put the model's {TOKENIZER_FILE} in the folder, or download "
                        "its tokenizer files again") from None
    return (lambda text, add_special_tokens=True: list(tok(text, add_special_tokens=add_special_tokens)[
        "input_ids"])), (lambda ids: tok.decode(ids, skip_special_tokens=True))


def read_fast_tokenizer(path: Path):
    """tokenizers.Tokenizer of a tokenizer.json; one WideError naming the file where it cannot be read."""
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception as err:  # noqa: BLE001 - the tokenizers library raises a bare Exception on bad JSON
        raise WideError(f"cannot read the tokenizer {path}: {_first_line(err)}",
                        "the tokenizer file looks damaged; download it again or save it with "
                        "save_pretrained (remove it to run on token ids only)") from None


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:160] if text else type(err).__name__


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
