"""Generation with the reference model: prefill, then one token per step with the KV cache.

`greedy_generate` is the oracle's loop (the tuple cache, any left padding). `generate` is the loop of the
fast CPU path (`wide-export generate`, `bench generate`): a preallocated cache (modeling.StaticKV), greedy or
sampled, each token handed to a callback as it is chosen.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch


def positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """position_ids for left padding: the count of real tokens before each position."""
    return (attention_mask.cumsum(-1) - 1).clamp(min=0)


@torch.no_grad()
def greedy_generate(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                    max_new_tokens: int = 8, collect=None) -> torch.Tensor:
    """New tokens [B, max_new_tokens] chosen by argmax; rows may be left-padded via attention_mask.

    `collect` (modeling.Collector) records every step's router masks when given.
    """
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    batch = input_ids.shape[0]
    past = model.empty_cache(batch)
    ids, mask, pos = input_ids, attention_mask, positions(attention_mask)
    new = []
    for _ in range(max_new_tokens):
        logits, past = model(ids, mask, pos, past, collect)
        ids = logits[:, -1].argmax(-1, keepdim=True)
        new.append(ids)
        mask = torch.cat([mask, mask.new_ones(batch, 1)], dim=1)
        pos = pos[:, -1:] + 1
    return torch.cat(new, dim=1) if new else input_ids.new_zeros(batch, 0)


@dataclass
class Sampling:
    """temperature 0: greedy (argmax). Otherwise softmax(logits / temperature), cut to the top_k most likely
    (0: all) and to the smallest set whose probability reaches top_p, drawn with a seeded generator."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self):
        self._gen = torch.Generator().manual_seed(self.seed)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """[B, V] float32 -> [B] token ids."""
        if self.temperature <= 0:
            return logits.argmax(-1)
        logits = logits / self.temperature
        if 0 < self.top_k < logits.shape[-1]:
            kth = logits.topk(self.top_k, dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if self.top_p < 1.0:
            sorted_p, order = probs.sort(dim=-1, descending=True)
            drop = sorted_p.cumsum(-1) - sorted_p >= self.top_p  # keep the first token whatever top_p is
            probs = probs.scatter(-1, order, sorted_p.masked_fill(drop, 0.0))
        return torch.multinomial(probs, 1, generator=self._gen)[:, 0]


@torch.no_grad()
def generate(model, input_ids: torch.Tensor, max_new_tokens: int, sampling: Optional[Sampling] = None,
             on_token: Optional[Callable[[int, torch.Tensor], None]] = None,
             stop: Optional[Callable[[torch.Tensor], bool]] = None) -> torch.Tensor:
    """New tokens [B, n <= max_new_tokens] for prompts of one length input_ids [B, T], with a preallocated KV
    cache of T + max_new_tokens positions. on_token(step, ids [B]) sees each step's tokens as they are
    chosen (step 0 after the prefill); stop(ids) ends early (e.g. every row reached an end token)."""
    sampling = sampling or Sampling()
    batch, t = input_ids.shape
    past = model.static_cache(batch, t + max_new_tokens)
    ids, pos = input_ids, torch.arange(t)[None].expand(batch, t)
    mask = torch.ones(batch, t + max_new_tokens, dtype=torch.long)
    new = []
    for step in range(max_new_tokens):
        logits, past = model(ids, mask[:, :past[0].length + ids.shape[1]], pos, past)  # past + new positions
        chosen = sampling(logits[:, -1])
        new.append(chosen)
        if on_token is not None:
            on_token(step, chosen)
        if stop is not None and stop(chosen):
            break
        ids, pos = chosen[:, None], torch.full((batch, 1), t + step, dtype=torch.long)
    return torch.stack(new, dim=1) if new else input_ids.new_zeros(batch, 0)
