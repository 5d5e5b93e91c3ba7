"""Algorithm choice for `algo="auto"`: a table per GPU architecture (policy.json).

The masked GEMMs have four algorithms (docs/kernels.md):
- ``gemv``: per-token, reads only the token's active weight bytes (decode);
- ``grouped``: per-group row lists and a grouped GEMM over them (prefill);
- ``tile``: token-order tiles, mask in the epilogue / K-slices skipped per tile;
- ``dense``: cuBLAS (torch) with the mask applied; never slower than the dense
  model by more than the mask pass, so it is the floor the others must beat.
Thresholds come from `wide-export bench kernels` on each architecture (``--record``
merges a measured ``policy-<arch>.json`` here, checked by ``validate``); until a
GPU run records them, the "default" entry's starting values are used. A record
is kept twice: as its architecture's entry (``sm_90``, what every GPU of that
architecture without its own entry takes) and as the entry of the GPU model it
was measured on (``sm_90@NVIDIA H200``: an H100 and an H200 keep their own
tuning, as vLLM keeps a config file per device name); ``policy_for(arch,
device)`` takes the device's entry first.

``prefill_tiles``: the prefill GEMMs' tile size per M bucket, per GEMM family
(configs.TILE_FAMILIES: tile_n, tile_gated, tile_k, grouped_n, grouped_gated),
as ``[[min_m, size], ...]`` (ascending, the first from 0; size one of the
family's configs.SIZES): a call of M rows takes the last bucket with
min_m <= M, where the architecture has that size (configs.size_for steps down
otherwise). The model is vLLM's fused-MoE config files (a tile config per
batch size, per device); here the sizes are a fixed set of compiled classes,
so the TensorRT plugins' cubins serve any bucket table.

``gemv_max_m`` is per kernel kind (``n``, ``gated``, ``k``): a down projection
that loses at T = 2 no longer turns the gated GEMV off. ``gemv_max_m_shapes``
(optional) overrides it for one projection shape, keyed ``"<kind>:<N>x<K>"``.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any, Optional

from wide_export.kernels.configs import TILE_FAMILIES, grouped_block_n

POLICY_FILE = Path(__file__).with_name("policy.json")
KINDS = ("n", "gated", "k")
ALGOS = ("auto", "dense", "gemv", "grouped", "tile")
FALLBACKS = ("dense", "tile")
INT_KEYS = ("grouped_n_min_m", "grouped_n_min_group_size", "grouped_k_min_m", "grouped_k_min_group_size")
MAX_SHAPE_RULES = 8  # what the C runtime's table holds per architecture (plugins/kernels/src/wide_kernels.cpp)
MAX_TILE_BUCKETS = 4  # prefill_tiles buckets per family the C runtime's table holds
DEVICE_NAME = re.compile(r"[A-Za-z0-9 ._()-]{1,64}")  # a GPU model name a device entry may carry (a C string)


def read_table(path: Optional[Path] = None) -> dict[str, Any]:
    """policy.json (or a copy at `path`) as it is on disk: the one reader of the file."""
    return json.loads(Path(path or POLICY_FILE).read_text())


@functools.lru_cache(maxsize=None)
def _table() -> dict[str, Any]:
    return read_table()


def device_key(arch: str, device: str) -> str:
    """The table key of one GPU model's entry: 'sm_90@NVIDIA H200'."""
    return f"{arch}@{device}"


def policy_for(arch: str, device: Optional[str] = None) -> dict[str, Any]:
    """The policy of a GPU model `device` (torch.cuda.get_device_name's name) of architecture `arch` ('sm_90',
    'interpreter', ...): its own entry, else the architecture's, else the default one ("arch": the key taken)."""
    table = _table()
    for key in ((device_key(arch, device),) if device else ()) + (arch,):
        if key in table:
            return {**table["default"], **table[key], "arch": key}
    return {**table["default"], "arch": "default"}


def shape_key(kind: str, N: int, K: int) -> str:
    return f"{kind}:{N}x{K}"


def gemv_max_m(kind: str, policy: dict[str, Any], N: Optional[int] = None, K: Optional[int] = None) -> int:
    """Up to how many rows `auto` runs the GEMV for this kind (and projection shape, when given)."""
    if N is not None and K is not None:
        rule = policy.get("gemv_max_m_shapes", {}).get(shape_key(kind, N, K))
        if rule is not None:
            return rule
    return policy["gemv_max_m"][kind]


def choose(kind: str, M: int, group_size: int, policy: dict[str, Any], N: Optional[int] = None,
           K: Optional[int] = None) -> str:
    """The algorithm `auto` runs for M rows of a `kind` ('n', 'gated', 'k') GEMM of shape [N, K]."""
    if M <= gemv_max_m(kind, policy, N, K):
        return "gemv"
    if kind == "k":
        if M >= policy["grouped_k_min_m"] and group_size >= policy["grouped_k_min_group_size"]:
            return "grouped"
    elif (M >= policy["grouped_n_min_m"] and group_size >= policy["grouped_n_min_group_size"]
          and grouped_block_n(group_size)):
        return "grouped"
    return policy["fallback"]


def tile_size(fam: str, M: int, policy: dict[str, Any]) -> str:
    """The size class the policy's prefill_tiles bucket gives a `fam` GEMM of M rows (before configs.size_for
    steps it down to what the architecture, dtype and alignment have)."""
    size = "small"
    for min_m, s in policy["prefill_tiles"][fam]:
        if M >= min_m:
            size = s
    return size


def _tile_errors(arch: str, tiles: Any) -> list[str]:
    if not isinstance(tiles, dict) or set(tiles) != set(TILE_FAMILIES):
        return [f"{arch}: 'prefill_tiles' must map each of {list(TILE_FAMILIES)} to its buckets"]
    errs = []
    for fam, buckets in tiles.items():
        sizes = TILE_FAMILIES[fam]
        shape = (f"{arch}: prefill_tiles[{fam!r}] must be 1 to {MAX_TILE_BUCKETS} [min_m, size] buckets, "
                 f"min_m ascending from 0, size one of {list(sizes)}")
        well_formed = (isinstance(buckets, list) and 1 <= len(buckets) <= MAX_TILE_BUCKETS
                       and all(isinstance(b, list) and len(b) == 2 and _is_count(b[0]) and b[1] in sizes
                               for b in buckets))
        if not well_formed or buckets[0][0] != 0 or any(a[0] >= b[0] for a, b in zip(buckets, buckets[1:])):
            errs.append(f"{shape}, got {buckets!r}")
    return errs


def _is_count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**31


def validate_entry(arch: str, entry: Any) -> list[str]:
    """What is wrong with one architecture's entry (empty when it is valid)."""
    if not isinstance(entry, dict):
        return [f"{arch}: must be an object, got {type(entry).__name__}"]
    errs = []
    if not isinstance(entry.get("measured"), bool):
        errs.append(f"{arch}: 'measured' must be true or false")
    g = entry.get("gemv_max_m")
    if not isinstance(g, dict) or set(g) != set(KINDS) or not all(_is_count(v) for v in g.values()):
        errs.append(f"{arch}: 'gemv_max_m' must map each of {list(KINDS)} to a row count >= 0, got {g!r}")
    for k in INT_KEYS:
        if not _is_count(entry.get(k)):
            errs.append(f"{arch}: {k!r} must be an int >= 0, got {entry.get(k)!r}")
    errs += _tile_errors(arch, entry.get("prefill_tiles"))
    if entry.get("fallback") not in FALLBACKS:
        errs.append(f"{arch}: 'fallback' must be one of {list(FALLBACKS)}, got {entry.get('fallback')!r}")
    shapes = entry.get("gemv_max_m_shapes", {})
    if not isinstance(shapes, dict) or len(shapes) > MAX_SHAPE_RULES:
        errs.append(f"{arch}: 'gemv_max_m_shapes' must be an object of at most {MAX_SHAPE_RULES} rules")
    else:
        for key, v in shapes.items():
            kind, _, nk = str(key).partition(":")
            n, _, k = nk.partition("x")
            if kind not in KINDS or not (n.isdigit() and k.isdigit()) or not _is_count(v):
                errs.append(f"{arch}: gemv_max_m_shapes[{key!r}] must be '<kind>:<N>x<K>' -> int >= 0")
    known = {"measured", "gemv_max_m", "gemv_max_m_shapes", "prefill_tiles", "fallback", "device", "dtype",
             *INT_KEYS}
    if "large_tile_min_m" in entry:  # the one switch before the buckets (no measured record ever held it)
        errs.append(f"{arch}: 'large_tile_min_m' is now 'prefill_tiles': per family, [[0, \"small\"], "
                    f"[<that M>, \"large\"]]")
    extra = sorted(set(entry) - known - {"large_tile_min_m"})
    if extra:
        errs.append(f"{arch}: unknown keys {extra}")
    return errs


def _gpu_arch(key: str) -> bool:
    """Whether `key` names a GPU architecture ('sm_90'), not a GPU model's entry, 'default' or 'interpreter'."""
    return key.startswith("sm_") and key[3:].isdigit()


def _arch_ok(arch: str) -> bool:
    base, at, device = arch.partition("@")
    if at:
        return _gpu_arch(base) and bool(DEVICE_NAME.fullmatch(device))
    return arch in ("default", "interpreter") or _gpu_arch(arch)


def validate(table: Any) -> list[str]:
    """What is wrong with a whole policy table (policy.json or a recorded policy-<arch>.json)."""
    if not isinstance(table, dict):
        return ["the policy must be a JSON object keyed by architecture"]
    errs = []
    for arch, entry in table.items():
        if arch.startswith("_"):
            continue
        if not _arch_ok(arch):
            errs.append(f"{arch!r}: architecture keys are 'default', 'interpreter', 'sm_<NN>' or "
                        f"'sm_<NN>@<GPU name>' (letters, digits, spaces, ._()-)")
            continue
        errs += validate_entry(arch, entry)
    return errs


def dump(table: dict[str, Any]) -> str:
    """policy.json's text: one line per architecture (diffs of a recorded policy stay one line)."""
    items = list(table.items())
    lines = ["{"]
    for i, (k, v) in enumerate(items):
        lines.append(f"  {json.dumps(k)}: {json.dumps(v)}" + ("," if i < len(items) - 1 else ""))
    return "\n".join(lines + ["}"]) + "\n"


def merge_recorded(recorded: Any, table: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """(table with the recorded architectures replaced, what is wrong with the record); the table is unchanged
    when the record is refused. A record is `bench kernels`' policy-<arch>.json: measured sm_<NN> entries only;
    each also becomes the entry of the GPU model it names ("device"), when that name can be a key."""
    errs = validate(recorded)
    if not errs:
        if not recorded or all(k.startswith("_") for k in recorded):
            errs.append("the record holds no architecture")
        for arch, entry in recorded.items():
            if arch.startswith("_"):
                continue
            if not _gpu_arch(arch):
                errs.append(f"{arch!r}: a record sets measured GPU architectures (sm_<NN>) only")
            elif entry.get("measured") is not True:
                errs.append(f"{arch}: a record must be measured (\"measured\": true)")
    if errs:
        return table, errs
    out = dict(table)
    for arch, entry in recorded.items():
        if not arch.startswith("_"):
            out[arch] = entry
            device = entry.get("device")
            if isinstance(device, str) and DEVICE_NAME.fullmatch(device):
                out[device_key(arch, device)] = entry
    return out, []
