"""What a repository carries to speak text: the export's tokenizer files and its generation settings.

`wide-export onnx` copies the model folder's tokenizer files (and writes the
demo model's) next to model.onnx, `wide-export trt` copies them next to the
engine; `wide-export triton` puts them beside the generation model
(`<model>/1/`), where model.py reads `tokenizer.json` (text in and out, stop
strings) and the OpenAI front door reads `tokenizer_config.json` /
`chat_template.jinja` (the chat template) through transformers.

The eos ids (generation stops at any of them) and the pad id come from the
export's `generation_config.json` (a list or one id), else its
`genai_config.json` (which `wide-export onnx` fills from generation_config.json
over config.json); a pad id that neither names falls back to the first eos id,
as transformers' `generate` does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from wide_export.base.errors import WideError
from wide_export.base.names import GENAI_CONFIG
from wide_export.base.paths import confined, read_confined, read_json

TOKENIZER_JSON = "tokenizer.json"


def _json(path: Path) -> Optional[dict]:
    if not path.is_file():
        return None
    raw = read_json(confined(path, path.parent, "generation settings"),
                    hint="restore it from the model folder, or delete it to serve without its settings")
    if not isinstance(raw, dict):
        raise WideError(f"{path}: expected a JSON object")
    return raw


def _ids(value, where: str) -> list[int]:
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise WideError(f"{where} must be a token id or a list of them, got {value!r}")
    return values


def generation_tokens(folder: Path, vocab_size: int) -> dict:
    """{"eos_token_ids": [...], "pad_token_id": id} for generation.json."""
    gen = _json(folder / "generation_config.json") or {}
    genai = (_json(folder / GENAI_CONFIG) or {}).get("model", {})
    eos: list[int] = []
    for source, raw in ((f"{folder}/generation_config.json", gen), (f"{folder}/{GENAI_CONFIG}", genai)):
        if raw.get("eos_token_id") is not None:
            eos = _ids(raw["eos_token_id"], f"{source}: eos_token_id")
            break
    pad = next((raw["pad_token_id"] for raw in (gen, genai) if raw.get("pad_token_id") is not None), None)
    pad = _ids(pad, f"{folder}: pad_token_id")[0] if pad is not None else (eos[0] if eos else 0)
    bad = [i for i in eos + [pad] if i >= vocab_size]
    if bad:
        raise WideError(f"{folder}: eos/pad token id {bad[0]} is outside the model's vocabulary of {vocab_size}",
                        hint="fix generation_config.json to name this model's special tokens")
    return {"eos_token_ids": eos, "pad_token_id": pad}


def check_tokenizer(folder: Path, vocab_size: int) -> Optional[int]:
    """The tokenizer's size when `folder` has tokenizer.json (None otherwise); WideError when it
    cannot be loaded or has ids the model does not."""
    path = folder / TOKENIZER_JSON
    if not path.is_file():
        return None
    from tokenizers import Tokenizer

    hint = "copy the model's tokenizer files again (save_pretrained)"
    text = read_confined(path, folder, "tokenizer", hint=hint)  # the JSON size limit, before any parsing
    try:
        size = Tokenizer.from_str(text.decode("utf-8")).get_vocab_size(with_added_tokens=True)
    except Exception as err:  # noqa: BLE001 - tokenizers raises a bare Exception on a bad file
        raise WideError(f"cannot load {path}: {(str(err).splitlines() or [type(err).__name__])[0][:160]}",
                        hint=hint) from None
    if size > vocab_size:
        raise WideError(f"{path} has {size} tokens, the model's vocabulary {vocab_size}",
                        hint="the folder's tokenizer does not belong to this model")
    return size
