"""Greedy generation with the reference model (prefill, then one token per step with the KV cache)."""

from __future__ import annotations

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
