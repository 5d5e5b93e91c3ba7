"""The PyTorch model as the step of the one generation loop (wide_export/generation/decoding.py), and its sampling.

`decoding.decode_loop(step, input_ids, attention_mask, n, choose)` keeps the bookkeeping (the ids, attention
mask and positions of each step, left padding included), chooses each token (`greedy`, or `Sampling`), hands
it to a callback and stops early when asked; `step(ids, mask, positions) -> logits [B, T, V]` computes a
forward and keeps its own KV cache. Steps: the PyTorch model with a tuple cache (`TorchStep`: the reference,
verification) or a preallocated one (the fast CPU path), the ranks of a sharded export (tp/run.py).
`greedy_generate` and `generate` are the loop on the PyTorch model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import torch

from wide_export.generation.decoding import decode_loop

# A temperature below this samples greedily (argmax), as vLLM's _SAMPLING_EPS. The Triton model's numpy sampler
# (generation/rows.py, copied self-contained into repositories, so it cannot import this) holds the same value;
# tests/triton/test_generation_model_units.py pins the two equal.
GREEDY_TEMPERATURE = 1e-5


class TorchStep:
    """The PyTorch model (modeling.WideForCausalLM) as the loop's step: its KV cache kept here (`past`: the
    tuple cache of empty_cache(batch), or a preallocated static_cache), `collect` recording router masks."""

    def __init__(self, model, past, collect=None):
        self.model, self.past, self.collect = model, past, collect

    def __call__(self, ids: np.ndarray, mask: np.ndarray, pos: np.ndarray) -> torch.Tensor:
        logits, self.past = self.model(torch.from_numpy(ids), torch.from_numpy(mask), torch.from_numpy(pos),
                                       self.past, self.collect)
        return logits


@torch.no_grad()
def greedy_generate(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                    max_new_tokens: int = 8, collect=None) -> torch.Tensor:
    """New tokens [B, max_new_tokens] chosen by argmax; rows may be left-padded via attention_mask.

    `collect` (modeling.Collector) records every step's router masks when given.
    """
    step = TorchStep(model, model.empty_cache(input_ids.shape[0]), collect)
    mask = None if attention_mask is None else attention_mask.numpy()
    return torch.from_numpy(decode_loop(step, input_ids.numpy(), mask, max_new_tokens))


@dataclass
class Sampling:
    """temperature below GREEDY_TEMPERATURE (0 included): greedy (argmax). Otherwise softmax(logits /
    temperature), cut to the top_k most likely (0: all) and to the smallest set whose probability reaches top_p
    (the most likely token kept whatever top_p is), drawn with a seeded generator."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self):
        self._gen = torch.Generator().manual_seed(self.seed)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """[B, V] float32 -> [B] token ids."""
        if self.temperature < GREEDY_TEMPERATURE:
            return logits.argmax(-1)
        logits = logits / self.temperature
        if 0 < self.top_k < logits.shape[-1]:
            kth = logits.topk(self.top_k, dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if self.top_p < 1.0:
            sorted_p, order = probs.sort(dim=-1, descending=True)
            drop = sorted_p.cumsum(-1) - sorted_p >= self.top_p
            drop[:, 0] = False  # the most likely token stays whatever top_p is (1e-300 is 0 in float32)
            probs = probs.scatter(-1, order, sorted_p.masked_fill(drop, 0.0))
        return torch.multinomial(probs, 1, generator=self._gen)[:, 0]


@torch.no_grad()
def generate(model, input_ids: torch.Tensor, max_new_tokens: int, sampling: Optional[Sampling] = None,
             on_token: Optional[Callable[[int, np.ndarray], None]] = None,
             stop: Optional[Callable[[np.ndarray], bool]] = None) -> torch.Tensor:
    """New tokens [B, n <= max_new_tokens] for prompts of one length input_ids [B, T], with a preallocated KV
    cache of T + max_new_tokens positions. on_token(step, ids [B]) sees each step's tokens as they are
    chosen (step 0 after the prefill); stop(ids) ends early (e.g. every row reached an end token)."""
    batch, t = input_ids.shape
    step = TorchStep(model, model.static_cache(batch, t + max_new_tokens))
    return torch.from_numpy(decode_loop(step, input_ids.numpy(), None, max_new_tokens, sampling or Sampling(),
                                        on_token, stop))
