"""Optimization-profile shapes for the one prefill + decode engine.

One engine, two profiles (plugins/trt/README.md, "One engine, two profiles"):
  profile 0 "prefill": batch 1..B, new tokens 1..L, past length 0
  profile 1 "decode":  batch 1..B, 1 new token,     past length 1..S-1
Every graph input's axes are classified by the input's name (the Hugging Face
/ onnxruntime-genai I/O names, README "wide-export onnx"); static axes keep the graph's size.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Sequence

from wide_export.base.errors import WideError
from wide_export.ops.io_spec import axes_of
from wide_export.trt.recipes import ProfileLimits

# Profile role of each named axis of the I/O contract (ops/io_spec.py); other axes are
# static (None): the graph gives their size.
ROLE_OF_AXIS = {"batch_size": "batch", "sequence_length": "tokens", "total_sequence_length": "total",
                "past_sequence_length": "past"}
_INPUT = re.compile(r"input_ids|attention_mask|position_ids|past_key_values\.\d+\.(key|value)")

PROFILE_NAMES = ("prefill", "decode")


@dataclass(frozen=True)
class Profile:
    """One optimization profile: name and {input: (min, opt, max)} shapes."""

    name: str
    shapes: dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]

    def to_dict(self, index: int) -> dict:
        return {"name": self.name, "index": index,
                "shapes": {k: {"min": list(v[0]), "opt": list(v[1]), "max": list(v[2])}
                           for k, v in self.shapes.items()}}


def _role_ranges(limits: ProfileLimits) -> dict[str, dict[str, tuple[int, int, int]]]:
    b, L, S = limits.max_batch, limits.max_input_len, limits.max_seq_len
    batch = (1, max(1, (b + 1) // 2), b)
    past_max = S - 1
    return {
        "prefill": {"batch": batch, "tokens": (1, max(1, (L + 1) // 2), L), "past": (0, 0, 0),
                    "total": (1, max(1, (L + 1) // 2), L)},
        "decode": {"batch": batch, "tokens": (1, 1, 1), "past": (1, max(1, past_max // 2), past_max),
                   "total": (2, max(2, past_max // 2 + 1), S)},
    }


def roles_of(name: str, rank: int) -> tuple[Optional[str], ...]:
    """Axis roles of graph input `name`; WideError for an input the engine cannot size."""
    if _INPUT.fullmatch(name):
        roles = tuple(ROLE_OF_AXIS.get(axis) for axis in axes_of(name))
        if len(roles) != rank:
            raise WideError(f"graph input {name} has rank {rank}, expected {len(roles)}")
        return roles
    raise WideError(f"graph input {name!r} is not one the engine profiles know",
                    hint="inputs must follow the wide-export I/O contract (input_ids, attention_mask, "
                    "position_ids, past_key_values.{i}.key|value)")


def build_profiles(inputs: Sequence[tuple[str, Sequence[int]]], limits: ProfileLimits) -> list[Profile]:
    """Prefill and decode profiles for graph inputs given as (name, dims with -1 = dynamic)."""
    ranges = _role_ranges(limits)
    profiles = []
    for phase in PROFILE_NAMES:
        shapes = {}
        for name, dims in inputs:
            roles = roles_of(name, len(dims))
            lo, opt, hi = [], [], []
            for axis, (role, dim) in enumerate(zip(roles, dims)):
                if role is None:
                    if dim < 0:
                        raise WideError(f"graph input {name} axis {axis} must have a static size")
                    triple = (dim, dim, dim)
                else:
                    triple = ranges[phase][role]
                    if dim >= 0 and not triple[0] <= dim <= triple[2]:
                        raise WideError(f"graph input {name} axis {axis} is fixed to {dim}, outside the "
                                        f"{phase} range {triple[0]}..{triple[2]}")
                    if dim >= 0:
                        triple = (dim, dim, dim)
                lo.append(triple[0]); opt.append(triple[1]); hi.append(triple[2])  # noqa: E702
            shapes[name] = (tuple(lo), tuple(opt), tuple(hi))
        profiles.append(Profile(phase, shapes))
    return profiles
