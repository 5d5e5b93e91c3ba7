"""An engine folder as the tensorrt flavour reads it (wide_engine.json schema in
wide_export/tritonserver/trt_engines.py), written by tests: opaque engine bytes, no TensorRT."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def _io(layers: int, kv_type: str, vocab: int, heads: int, dim: int) -> tuple[list, list]:
    ins = [{"name": n, "dtype": "int64", "shape": [-1, -1]} for n in ("input_ids", "attention_mask", "position_ids")]
    outs = [{"name": "logits", "dtype": "float32", "shape": [-1, -1, vocab]}]
    for i in range(layers):
        for kind in ("key", "value"):
            ins.append({"name": f"past_key_values.{i}.{kind}", "dtype": kv_type, "shape": [-1, heads, -1, dim]})
            outs.append({"name": f"present.{i}.{kind}", "dtype": kv_type, "shape": [-1, heads, -1, dim]})
    return ins, outs


def _profile(name: str, batch: int, seq: tuple, past: tuple, layers: int, heads: int, dim: int) -> dict:
    shapes = {
        "input_ids": {"min": [1, seq[0]], "opt": [1, seq[1]], "max": [batch, seq[1]]},
        "position_ids": {"min": [1, seq[0]], "opt": [1, seq[1]], "max": [batch, seq[1]]},
        "attention_mask": {"min": [1, seq[0] + past[0]], "opt": [1, seq[1] + past[1]],
                           "max": [batch, seq[1] + past[1]]},
    }
    for i in range(layers):
        for kind in ("key", "value"):
            shapes[f"past_key_values.{i}.{kind}"] = {"min": [1, heads, past[0], dim], "opt": [1, heads, past[1], dim],
                                                    "max": [batch, heads, past[1], dim]}
    return {"name": name, "shapes": shapes}


def write_engine_folder(folder: Path, layers: int = 3, vocab: int = 97, kv_type: str = "float16", heads: int = 2,
                        dim: int = 4, max_pos: int = 4096, seed: int = 0) -> dict:
    """An engine folder as `wide-export trt` documents it: opaque engine bytes + manifest."""
    folder.mkdir()
    rng = np.random.default_rng(seed)
    (folder / "model.engine").write_bytes(rng.bytes(256))
    (folder / "libwide_plugins.so").write_bytes(rng.bytes(64))
    ins, outs = _io(layers, kv_type, vocab, heads, dim)
    manifest = {
        "tensorrt": {"package": "tensorrt_rtx", "version": "1.7.1"},
        "plugins": ["libwide_plugins.so"],
        "model": {"num_layers": layers, "num_key_value_heads": heads, "head_dim": dim, "vocab_size": vocab,
                  "dtype": kv_type, "max_position_embeddings": max_pos},
        "engines": [{"file": "model.engine", "inputs": ins, "outputs": outs,
                     "profiles": [_profile("prefill", 4, (1, 256), (0, 0), layers, heads, dim),
                                  _profile("decode", 6, (1, 1), (1, 1023), layers, heads, dim)]}],
    }
    (folder / "wide_engine.json").write_text(json.dumps(manifest))
    return manifest
