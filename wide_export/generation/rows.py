"""The rows of a request (copied as `<model>/1/rows.py`): one prompt each with its own sampling settings,
what the model can serve (validate_row), and how each row's next token is chosen (choose_tokens).

Self-contained (numpy only) like model.py, which loads it from its own folder."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np


# A temperature below this samples greedily (argmax), as vLLM's _SAMPLING_EPS: logits / a tiny temperature
# overflow to inf (no distribution left to draw from). generation/torch_step.py's Sampling (torch) holds the same value
# (this file stays self-contained); tests/triton/test_generation_model_units.py pins the two equal.
GREEDY_TEMPERATURE = 1e-5


class RequestError(ValueError):
    """A malformed request: answered with an error, the model keeps serving."""


@dataclass
class Row:
    """One prompt to continue, with its own sampling settings."""

    prompt: np.ndarray
    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: Optional[int] = None
    stop_ids: tuple = ()  # the eos ids (unless ignore_eos) and the request's stop token ids
    stop_strings: tuple = ()
    padding: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # ids left of a shorter prompt; none: 0


def validate_row(row: Row, settings) -> None:
    """Raise RequestError for anything the model (settings.Settings) cannot serve."""
    if row.prompt.ndim != 1 or row.prompt.size == 0:
        raise RequestError("input_ids is empty: send at least one prompt token")
    if row.prompt.size >= settings.max_total_tokens:
        raise RequestError(f"prompt ({row.prompt.size} tokens) + one new token exceeds the model's limit of "
                           f"{settings.max_total_tokens} tokens")
    if row.max_new_tokens <= 0:
        raise RequestError(f"max_new_tokens must be >= 1, got {row.max_new_tokens}")
    total = row.prompt.size + row.max_new_tokens
    if total > settings.max_total_tokens:
        raise RequestError(
            f"prompt ({row.prompt.size} tokens) + max_new_tokens ({row.max_new_tokens}) = {total} "
            f"exceeds the model's limit of {settings.max_total_tokens} tokens"
        )
    if settings.max_prompt_tokens and row.prompt.size > settings.max_prompt_tokens:
        raise RequestError(
            f"prompt has {row.prompt.size} tokens, the engine's prefill allows {settings.max_prompt_tokens}")
    low, high = int(row.prompt.min()), int(row.prompt.max())
    if low < 0 or high >= settings.vocab_size:
        raise RequestError(f"input_ids must lie in [0, {settings.vocab_size}), got values in [{low}, {high}]")
    if not np.isfinite(row.temperature) or row.temperature < 0:
        raise RequestError(f"temperature must be >= 0, got {row.temperature}")
    if not (0.0 < row.top_p <= 1.0):
        raise RequestError(f"top_p must be in (0, 1], got {row.top_p}")
    if row.seed is not None and row.seed < 0:
        raise RequestError(f"seed must be >= 0, got {row.seed}")


def choose_tokens(logits: np.ndarray, rows: list[Row], rngs: list[np.random.Generator]) -> np.ndarray:
    """Next token per row: argmax when temperature is below GREEDY_TEMPERATURE (0 included), else
    temperature/top-p sampling; top_p keeps the most likely token whatever its value."""
    out = np.argmax(logits, axis=-1).astype(np.int64)
    for b, row in enumerate(rows):
        if row.temperature < GREEDY_TEMPERATURE:
            continue
        z = logits[b].astype(np.float64) / row.temperature
        probs = np.exp(z - z.max())
        probs /= probs.sum()
        order = np.argsort(-probs, kind="stable")
        cumulative = np.cumsum(probs[order])
        keep = order[: int(np.searchsorted(cumulative, row.top_p) + 1)]  # smallest set reaching top_p (one at least)
        kept = probs[keep] / probs[keep].sum()
        out[b] = keep[rngs[b].choice(keep.size, p=kept)]
    return out
