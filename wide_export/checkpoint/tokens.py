"""A checkpoint's special token ids (bos / eos / pad), read as transformers' generate reads them: every runtime
(the export's genai_config.json, the CPU generator, the Triton repository) takes them from here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from wide_export.base.errors import WideError
from wide_export.base.paths import confined, read_json

TOKEN_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")


def model_folder(loaded) -> Path | None:
    """The Hugging Face folder the model was loaded from (None for the in-memory demo model)."""
    if getattr(loaded, "model_dir", None) is not None:
        return Path(loaded.model_dir)  # as given: in a Hugging Face snapshot, config.json resolves into blobs/
    path = loaded.sources.get("config", {}).get("path")
    return Path(path).parent if path else None


def special_tokens(loaded) -> dict[str, Any]:
    """bos/eos/pad ids: generation_config.json over config.json (as transformers' generate does).

    The demo model has no folder: its ids are those of its transformers config
    (Llama's defaults: bos 1, eos 2). A missing pad id falls back to the first
    eos id, as `generate` does.
    """
    folder = model_folder(loaded)
    ids: dict[str, Any] = {k: None for k in TOKEN_KEYS}
    if folder is None:
        from wide_export.model.demo import DEMO_SPEC

        hf = DEMO_SPEC.hf_config()
        ids.update({k: getattr(hf, k, None) for k in TOKEN_KEYS})
    else:
        for name in ("config.json", "generation_config.json"):
            path = folder / name
            if not path.is_file():
                continue
            confined(path, folder, "token defaults file")
            try:
                raw = read_json(path)
            except WideError:
                continue  # config.json was parsed at load time; a broken generation_config is ignored
            if not isinstance(raw, dict):
                continue
            ids.update({k: raw[k] for k in TOKEN_KEYS if raw.get(k) is not None})
    if ids["bos_token_id"] is None:
        ids["bos_token_id"] = 1
    if ids["eos_token_id"] is None:
        ids["eos_token_id"] = 2
    eos = ids["eos_token_id"]
    if ids["pad_token_id"] is None:
        ids["pad_token_id"] = eos[0] if isinstance(eos, list) else eos
    return ids
