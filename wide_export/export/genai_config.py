"""genai_config.json beside model.onnx, so onnxruntime-genai loads a wide-export folder as it is.

The graph already follows onnxruntime-genai's decoder contract (io_spec.py):
input_ids / attention_mask / position_ids / past_key_values.%d.key|value in,
logits / present.%d.key|value out. This file only states that contract, the
dimensions, the special token ids and the context length, and copies the
model folder's tokenizer files (onnxruntime-genai reads tokenizer.json +
tokenizer_config.json from the same folder).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from wide_export.model.arch import arch_for
from wide_export.base.names import GENAI_CONFIG as GENAI_CONFIG_NAME
from wide_export.base.paths import confined

from wide_export.checkpoint.hf import TOKENIZER_FILES  # copied into the export
from wide_export.checkpoint.tokens import model_folder, special_tokens

SERVED_FILES = (*TOKENIZER_FILES, GENAI_CONFIG_NAME)  # what an engine folder and a Triton repository carry along


def serving_files(folder: Path) -> list[Path]:
    """The tokenizer / generation files present in an export or engine folder, each resolving inside it
    (a symlink to anywhere else is refused with one line, not copied)."""
    files = [folder / name for name in SERVED_FILES if (folder / name).is_file()]
    for path in files:
        confined(path, folder, "tokenizer file")
    return files


def genai_config(loaded, model_file: str) -> dict[str, Any]:
    """The genai_config.json dict for an export of `loaded` whose graph file is `model_file`."""
    cfg = loaded.config
    tokens = special_tokens(loaded)
    context = int(cfg.max_position_embeddings)
    return {
        "model": {
            "bos_token_id": tokens["bos_token_id"],
            "context_length": context,
            "decoder": {
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
                "filename": model_file,
                "head_size": cfg.head_dim,
                "hidden_size": cfg.hidden_size,
                "inputs": {
                    "input_ids": "input_ids",
                    "attention_mask": "attention_mask",
                    "position_ids": "position_ids",
                    "past_key_names": "past_key_values.%d.key",
                    "past_value_names": "past_key_values.%d.value",
                },
                "outputs": {
                    "logits": "logits",
                    "present_key_names": "present.%d.key",
                    "present_value_names": "present.%d.value",
                },
                "num_attention_heads": cfg.num_attention_heads,
                "num_hidden_layers": cfg.num_layers,
                "num_key_value_heads": cfg.num_key_value_heads,
            },
            "eos_token_id": tokens["eos_token_id"],
            "pad_token_id": tokens["pad_token_id"],
            "type": arch_for(cfg.model_type).genai_type,
            "vocab_size": cfg.vocab_size,
        },
        "search": {
            "diversity_penalty": 0.0,
            "do_sample": False,
            "early_stopping": True,
            "length_penalty": 1.0,
            "max_length": context,
            "min_length": 0,
            "no_repeat_ngram_size": 0,
            "num_beams": 1,
            "num_return_sequences": 1,
            # the graph concatenates past + new (present is longer than past): no shared buffer
            "past_present_share_buffer": False,
            "repetition_penalty": 1.0,
            "temperature": 1.0,
            "top_k": 50,
            "top_p": 1.0,
        },
    }


def write_genai_files(loaded, folder: Path, model_file: str) -> list[str]:
    """Write genai_config.json into `folder` and copy the tokenizer files; returns the copied names."""
    folder = Path(folder)
    (folder / GENAI_CONFIG_NAME).write_text(json.dumps(genai_config(loaded, model_file), indent=2) + "\n")
    copied = []
    if model_folder(loaded) is None:  # the in-memory demo model: its byte-level tokenizer, so the export takes text
        from wide_export.model.demo_tokenizer import write_demo_tokenizer

        return write_demo_tokenizer(folder)
    from wide_export.base.paths import copy_confined

    for path in tokenizer_files(loaded):
        copy_confined(path, folder / path.name, model_folder(loaded), "tokenizer file")  # no check-then-copy race
        copied.append(path.name)
    return copied


def tokenizer_files(loaded) -> list[Path]:
    """The model folder's tokenizer files that write_genai_files copies, each checked to lie inside the
    folder (or its Hugging Face blob store): a symlink to anywhere else is refused, not copied."""
    src = model_folder(loaded)
    if src is None:
        return []
    files = [src / name for name in TOKENIZER_FILES if (src / name).is_file()]
    for path in files:
        confined(path, src, "tokenizer file")
    return files


def check_genai_sources(loaded) -> None:
    """Refuse escaping tokenizer / generation_config files before minutes of export, not at the end."""
    tokenizer_files(loaded)
    special_tokens(loaded)
