"""Algorithm choice for `algo="auto"`: a table per GPU architecture (policy.json).

The masked GEMMs have four algorithms (docs/kernels.md):
- ``gemv``: per-token, reads only the token's active weight bytes (decode);
- ``grouped``: per-group row lists and a grouped GEMM over them (prefill);
- ``tile``: token-order tiles, mask in the epilogue / K-slices skipped per tile;
- ``dense``: cuBLAS (torch) with the mask applied; never slower than the dense
  model by more than the mask pass, so it is the floor the others must beat.
Thresholds come from `wide-export bench kernels` on each architecture; until a
GPU run records them, the "default" entry's starting values are used.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from wide_export.kernels.configs import grouped_block_n

POLICY_FILE = Path(__file__).with_name("policy.json")
KINDS = ("n", "gated", "k")
ALGOS = ("auto", "dense", "gemv", "grouped", "tile")


@functools.lru_cache(maxsize=None)
def _table() -> dict[str, Any]:
    return json.loads(POLICY_FILE.read_text())


def policy_for(arch: str) -> dict[str, Any]:
    """The policy of an architecture ('sm_90', 'interpreter', ...), else the default one."""
    table = _table()
    return {**table["default"], **table.get(arch, {}), "arch": arch if arch in table else "default"}


def choose(kind: str, M: int, group_size: int, policy: dict[str, Any]) -> str:
    """The algorithm `auto` runs for M rows."""
    if M <= policy["gemv_max_m"]:
        return "gemv"
    if kind == "k":
        if M >= policy["grouped_k_min_m"] and group_size >= policy["grouped_k_min_group_size"]:
            return "grouped"
    elif (M >= policy["grouped_n_min_m"] and group_size >= policy["grouped_n_min_group_size"]
          and grouped_block_n(group_size)):
        return "grouped"
    return policy["fallback"]
