"""What a generation model's generation.json says (copied as `<model>/1/settings.py`; written by
wide_export/tritonserver/repository.py), and the step function type every runtime's step has.

Self-contained (the standard library; numpy for a step's feeds) like model.py, which loads it from its own
folder; the one reader of generation.json (the OpenAI frontend and the serving benchmark read it through
`Settings.load`)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Callable

SETTINGS_FILE = "generation.json"


@dataclass
class Settings:
    """What generation.json says (see wide_export/tritonserver/repository.py)."""

    flavour: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    kv_dtype: str
    max_total_tokens: int
    io: dict
    max_prompt_tokens: int = 0  # 0: only max_total_tokens limits the prompt
    onnx_file: str = "model.onnx"
    engine_model: str = ""  # tensorrt: the tensorrt_plan model serving both phases
    prefill_model: str = ""  # tensorrt, engines split across files (and repositories before engine_model)
    decode_model: str = ""
    kv_cache_memory: str = "gpu"  # tensorrt: "gpu" (BLS outputs in GPU memory) or "cpu" (host numpy)
    eos_token_ids: list = field(default_factory=list)  # generation stops at any of them
    pad_token_id: int = 0  # fills output_ids of rows that ended before the others

    @classmethod
    def load(cls, folder: str) -> "Settings":
        path = os.path.join(folder, SETTINGS_FILE)
        with open(path) as f:
            raw = json.load(f)
        unknown = sorted(set(raw) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"{path}: unknown settings {unknown} (written by a newer wide-export?)")
        settings = cls(**raw)
        if settings.kv_cache_memory not in ("gpu", "cpu"):
            raise ValueError(f"{path}: kv_cache_memory must be \"gpu\" or \"cpu\", got {settings.kv_cache_memory!r}")
        if settings.flavour == "tensorrt" and not (settings.engine_model
                                                   or (settings.prefill_model and settings.decode_model)):
            raise ValueError(f"{path}: the tensorrt flavour needs engine_model (or prefill_model and decode_model)")
        return settings

    def model_for(self, phase: str) -> str:
        """The tensorrt_plan model a BLS request of this phase goes to."""
        named = self.prefill_model if phase == "prefill" else self.decode_model
        return named or self.engine_model

    def past_names(self) -> list[tuple[str, str]]:
        """(key, value) input names per layer."""
        key, value = self.io["past_key"], self.io["past_value"]
        return [(key.format(i=i), value.format(i=i)) for i in range(self.num_layers)]

    def feeds(self, ids, mask, positions, past) -> dict:
        """The graph's inputs by name for one step (decoding.Batch): `past` the cache per layer as (key,
        value), None for a prefill (an empty cache [B, H, 0, D] of the KV dtype)."""
        feeds = {self.io["input_ids"]: ids, self.io["attention_mask"]: mask, self.io["position_ids"]: positions}
        if past is None:
            import numpy as np  # the only use: settings are read where numpy is not needed

            empty = np.zeros((ids.shape[0], self.num_kv_heads, 0, self.head_dim), dtype=np.dtype(self.kv_dtype))
            past = [(empty, empty)] * self.num_layers
        for (k_name, v_name), (k, v) in zip(self.past_names(), past):
            feeds[k_name], feeds[v_name] = k, v
        return feeds

    def present_names(self) -> list[tuple[str, str]]:
        """(key, value) output names per layer."""
        key, value = self.io["present_key"], self.io["present_value"]
        return [(key.format(i=i), value.format(i=i)) for i in range(self.num_layers)]


# A step runs the graph once: (feeds by input name, phase) -> (logits, presents in layer order).
StepFn = Callable[[dict, str], tuple]
