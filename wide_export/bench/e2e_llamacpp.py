"""llama.cpp dense beside `bench e2e --device cpu`: the same layer shapes, dtype, threads and cases.

bench e2e times a stack of decoder layers of a model's shape. llama.cpp runs whole models, so this writes a
checkpoint of as many layers of the same shapes (model/synthetic.py; a 256-token vocabulary, so that the
embedding row and the LM head are under 0.3 % of the work: they are counted against llama.cpp), its GGUF
(bench/llamacpp.for_checkpoint), and times llama.cpp on each case:

- prefill T: one prompt of T tokens in one llama_decode (the median of `reps` runs);
- decode b=B: B prompts of `decode_context` tokens (untimed), then decode steps with all B sequences in one
  batch (timed: the mean step of `reps` steps).

Milliseconds per step become tokens/s scaled from the stack's layers to the model's exactly as bench e2e's
own cases are (common.model_rates). The values of the weights are llama.cpp's own random ones, not the stack's: a
dense GEMM's speed does not depend on them.
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path
from typing import Callable, Optional

VOCAB = 256


def spec_for(shape, layers: int, positions: int, seed: int):
    """The SyntheticSpec of `layers` decoder layers of a bench e2e StackShape."""
    from wide_export.model.synthetic import SyntheticSpec

    return SyntheticSpec(arch="llama", vocab_size=VOCAB, hidden_size=shape.hidden,
                         intermediate_size=shape.intermediate, num_layers=layers, num_heads=shape.heads,
                         num_kv_heads=shape.kv_heads, head_dim=shape.head_dim,
                         attn_groups=shape.heads // shape.heads_per_group,
                         ffn_groups=shape.intermediate // shape.ffn_group_size, rank=shape.router_rank,
                         max_position_embeddings=positions, seed=seed)


def time_llamacpp(shape, layers: int, preset, dtype: str, seed: int,
                  say: Optional[Callable[[str], None]] = None) -> tuple[dict, Optional[str]]:
    """({"llama.cpp f32": {"prefill 128": tok/s, "decode b=1": tok/s, ...}}, None), or ({}, the one line
    saying why there are no llama.cpp rows). dtype: float32 / bfloat16 / float16 (bench/llamacpp.GGUF_TYPES)."""
    from wide_export.bench.llamacpp import for_checkpoint, unavailable_reason

    why = unavailable_reason()
    if why:
        return {}, why
    from wide_export.model.synthetic import write_checkpoint

    say = say or (lambda _m: None)
    steps = max(preset.reps, 4)
    seq = max(max(preset.prefill_tokens) + 1, preset.decode_context + steps + 1)
    with tempfile.TemporaryDirectory(prefix="wide-bench-e2e-llamacpp-") as tmp:
        say(f"llama.cpp: writing {layers} {shape.name} layers as a checkpoint")
        ckpt = write_checkpoint(Path(tmp) / "ckpt", spec_for(shape, layers, seq + 8, seed))
        runs, why = for_checkpoint(ckpt, dtype, Path(tmp),
                                   lambda gguf: _cases(gguf, shape, layers, preset, seq, steps, seed, say), say)
    return runs, why


def _cases(gguf: Path, shape, layers: int, preset, seq: int, steps: int, seed: int, say) -> dict:
    import torch

    from wide_export.bench.common import model_rates
    from wide_export.bench.llamacpp import LlamaCppModel

    gen = torch.Generator().manual_seed(seed)

    def prompts(batch: int, length: int) -> list[list[int]]:
        return torch.randint(3, VOCAB, (batch, length), generator=gen).tolist()

    out = {}
    with LlamaCppModel(gguf, max_batch=max(preset.decode_batches), seq_tokens=seq) as model:
        model.generate(prompts(1, 8), 2)  # warm-up: threads started, buffers allocated
        for T in preset.prefill_tokens:
            say(f"llama.cpp: prefill {T}")
            ms = statistics.median(model.generate(prompts(1, T), 1).prefill_s * 1e3
                                   for _ in range(max(preset.reps, 1)))
            out[f"prefill {T}"] = model_rates((ms,), T, layers, shape.model_layers)[0]
        for B in preset.decode_batches:
            say(f"llama.cpp: decode batch {B} after {preset.decode_context} tokens")
            run = model.generate(prompts(B, preset.decode_context), steps + 1)
            ms = run.decode_s * 1e3 / run.decode_steps
            out[f"decode b={B}"] = model_rates((ms,), B, layers, shape.model_layers)[0]
    return out
