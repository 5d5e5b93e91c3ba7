"""`analyze --onnx OUT`: the export run by ONNX Runtime over the same windows as the reference.

Perplexity of the export and, per router, the fraction of (token, group) decisions that
agree with the PyTorch reference's on the same text (the masks are extra graph outputs,
as `wide-export verify` reads them).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Optional

from wide_export.base.errors import WideError


def open_export(onnx_dir: Path, cfg) -> tuple[object, dict]:
    """(ONNX Runtime session with the router masks as outputs, wide_config.json), checked against cfg."""
    from wide_export.export.onnx_export import read_wide_config
    from wide_export.export.session import debug_session

    config = read_wide_config(Path(onnx_dir))
    for key, want in (("num_layers", cfg.num_layers), ("vocab_size", cfg.vocab_size),
                      ("hidden_size", cfg.hidden_size)):
        if config.get(key) != want:
            raise WideError(f"the export in {onnx_dir} has {key}={config.get(key)}, the model has {want}",
                            "pass the export of this --model (and --router/--lora)")
    return debug_session(Path(onnx_dir), config), config


def onnx_windows(session, config: dict, chunks: list[list[int]], ref_masks: list[dict],
                 progress: Optional[Callable[[str], None]] = None) -> dict:
    """{"ppl": float, "agreement": {"layer.kind": fraction}, "decisions": n} over the windows."""
    import numpy as np

    pasts = {i["name"]: i for i in config["io"]["inputs"] if i["name"].startswith("past_key_values.")}
    np_dtype = {"float16": np.float16, "float32": np.float32}
    mask_names = {(i, kind): layer[kind]["mask"] for i, layer in enumerate(config["layers"])
                  for kind in ("attention", "ffn") if layer.get(kind)}
    outputs = [o.name for o in session.get_outputs()]
    nll, count = 0.0, 0
    same: dict[tuple[int, str], list[int]] = {}
    for n, (chunk, want) in enumerate(zip(chunks, ref_masks)):
        if progress:
            progress(f"onnxruntime: window {n + 1}/{len(chunks)}")
        T = len(chunk)
        feed = {"input_ids": np.array([chunk], dtype=np.int64), "attention_mask": np.ones((1, T), np.int64),
                "position_ids": np.arange(T, dtype=np.int64)[None]}
        for name, spec in pasts.items():
            feed[name] = np.zeros((1, spec["shape"][1], 0, spec["shape"][3]), np_dtype[spec["dtype"]])
        got = dict(zip(outputs, session.run(outputs, feed)))
        logits = got["logits"][0].astype(np.float64)
        top = logits[:-1].max(-1, keepdims=True)
        logp = logits[:-1] - top - np.log(np.exp(logits[:-1] - top).sum(-1, keepdims=True))
        nll -= logp[np.arange(T - 1), chunk[1:]].sum()
        count += T - 1
        for key, name in mask_names.items():
            agree = got[name].reshape(-1) == want[key].reshape(-1)
            acc = same.setdefault(key, [0, 0])
            acc[0] += int(agree.sum())
            acc[1] += agree.size
    return {"ppl": math.exp(nll / count),
            "agreement": {f"{i}.{kind}": a / b for (i, kind), (a, b) in sorted(same.items())},
            "dtype": config.get("dtype")}
