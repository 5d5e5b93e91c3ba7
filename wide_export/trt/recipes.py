"""Recipes: per-model group sizes, engine profile limits and verification tolerances.

A recipe is a JSON (or, on Python >= 3.11, TOML) file; the ones shipped live in
the package (`wide_export/recipes/`, package data, so a wheel has them too) and
can be named without a path (`--recipe llama-3.1-8b`). Schema (every section optional except `name`):

    name = "llama-3.1-8b"
    model = "meta-llama/Llama-3.1-8B"          # informative
    [group_sizes]  attention_heads_per_group = 4, ffn_channels_per_group = 128
    [profiles]     max_batch = 8, max_input_len = 2048, max_seq_len = 4096
    [tolerances.float16]  atol, rtol, stat, min_agreement, flip_margin   # any subset
    [tolerances.float32]  ...
Tolerance fields and defaults are those of wide_export/verify/tolerances.py
(the ONNX verification's table); a recipe only overrides them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

from wide_export.base.errors import WideError

RECIPES_DIR = Path(__file__).resolve().parents[1] / "recipes"  # wide_export/recipes: package data
TOLERANCE_FIELDS = ("atol", "rtol", "stat", "min_agreement", "flip_margin")
STATS = ("elemwise", "max", "mean", "median")


def tolerance_with(precision: str, overrides: dict[str, Any], where: str = "tolerance"):
    """wide_export.verify.tolerances default for `precision` with `overrides` applied and checked."""
    from wide_export.verify.tolerances import tolerance_for

    for key, value in overrides.items():
        if key == "stat":
            if value not in STATS:
                raise WideError(f"{where}: stat must be one of {', '.join(STATS)}, got {value!r}")
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 \
                or (key == "min_agreement" and value > 1):
            raise WideError(f"{where}: {key} must be a non-negative number"
                            + (" <= 1" if key == "min_agreement" else "") + f", got {value!r}")
    return replace(tolerance_for(precision), **{k: (v if k == "stat" else float(v)) for k, v in overrides.items()})


@dataclass(frozen=True)
class ProfileLimits:
    """Engine profile limits: prefill up to max_input_len tokens, decode up to max_seq_len in total."""

    max_batch: int = 4
    max_input_len: int = 128
    max_seq_len: int = 256

    def checked(self, max_position_embeddings: Optional[int] = None) -> "ProfileLimits":
        """Return self if the limits are consistent, else raise WideError."""
        for name in ("max_batch", "max_input_len", "max_seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise WideError(f"profile limit {name} must be a positive integer, got {value!r}")
        if self.max_seq_len < 2:
            raise WideError(f"max_seq_len={self.max_seq_len} leaves no room to decode",
                            hint="max_seq_len counts prompt + generated tokens; use >= 2")
        if self.max_input_len > self.max_seq_len:
            raise WideError(
                f"profile limits contradict each other: max_input_len={self.max_input_len} > "
                f"max_seq_len={self.max_seq_len}",
                hint="max_seq_len is the total (prompt + generated) length, so it must be >= max_input_len",
            )
        if max_position_embeddings is not None and self.max_seq_len > max_position_embeddings:
            raise WideError(
                f"max_seq_len={self.max_seq_len} exceeds the model's max_position_embeddings="
                f"{max_position_embeddings}",
                hint="lower --max-seq-len",
            )
        return self

    def override(self, **values: Optional[int]) -> "ProfileLimits":
        """Copy with the given non-None values replaced (CLI flags over recipe values)."""
        return replace(self, **{k: v for k, v in values.items() if v is not None})


@dataclass(frozen=True)
class Recipe:
    """A parsed recipe."""

    name: str
    source: Optional[Path] = None
    model: Optional[str] = None
    attention_heads_per_group: Optional[int] = None
    ffn_channels_per_group: Optional[int] = None
    limits: ProfileLimits = field(default_factory=ProfileLimits)
    # precision -> overrides of wide_export.verify.tolerances.Tolerance fields
    tolerances: dict[str, dict[str, Any]] = field(default_factory=dict)

    def tolerance(self, precision: str):
        """The verification Tolerance for `precision`: the documented default with this recipe's overrides."""
        return tolerance_with(precision, self.tolerances.get(precision, {}))

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "source": str(self.source) if self.source else None,
            "model": self.model,
            "group_sizes": {"attention_heads_per_group": self.attention_heads_per_group,
                            "ffn_channels_per_group": self.ffn_channels_per_group},
            "profiles": vars(self.limits),
            "tolerances": self.tolerances,
        }


def list_recipes() -> list[str]:
    """Names of the recipes shipped in wide_export/recipes/."""
    if not RECIPES_DIR.is_dir():
        return []
    return sorted(p.stem for p in RECIPES_DIR.iterdir() if p.suffix in (".json", ".toml"))


def resolve_recipe(spec: str | Path) -> Path:
    """A recipe file path from a path or a shipped recipe name."""
    path = Path(spec)
    if path.is_file():
        return path
    for suffix in (".json", ".toml"):
        candidate = RECIPES_DIR / f"{spec}{suffix}"
        if candidate.is_file():
            return candidate
    raise WideError(f"recipe {spec} not found",
                    hint=f"give a file, or one of: {', '.join(list_recipes()) or '(none shipped)'}")


def _read(path: Path) -> dict[str, Any]:
    text = path.read_text()
    try:
        if path.suffix == ".toml":
            import tomllib  # stdlib, Python >= 3.11

            return tomllib.loads(text)
        return json.loads(text)
    except ImportError:
        raise WideError(f"{path}: TOML recipes need Python >= 3.11", hint="use the JSON form") from None
    except ValueError as err:  # JSONDecodeError and TOMLDecodeError are ValueErrors
        raise WideError(f"{path} is not a valid recipe file: {err}") from None


def _section(raw: dict, key: str, allowed: set[str], path: Path, label: Optional[str] = None) -> dict[str, Any]:
    value = raw.get(key, {})
    label = label or key
    if not isinstance(value, dict):
        raise WideError(f"{path}: [{label}] must be a table/object")
    unknown = set(value) - allowed
    if unknown:
        raise WideError(f"{path}: unknown keys in [{label}]: {', '.join(sorted(unknown))}",
                        hint=f"allowed: {', '.join(sorted(allowed))}")
    return value


def _positive_int(value: Any, what: str, path: Path) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise WideError(f"{path}: {what} must be a positive integer, got {value!r}")
    return value


def load_recipe(spec: str | Path) -> Recipe:
    """Parse and validate a recipe (file path or shipped name)."""
    path = resolve_recipe(spec)
    raw = _read(path)
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
        raise WideError(f"{path}: a recipe needs a string `name`")
    unknown = set(raw) - {"name", "model", "description", "group_sizes", "profiles", "tolerances"}
    if unknown:
        raise WideError(f"{path}: unknown top-level keys {', '.join(sorted(unknown))}")
    groups = _section(raw, "group_sizes", {"attention_heads_per_group", "ffn_channels_per_group"}, path)
    profiles = _section(raw, "profiles", {"max_batch", "max_input_len", "max_seq_len"}, path)
    limits = ProfileLimits().override(
        **{k: _positive_int(v, f"profiles.{k}", path) for k, v in profiles.items()}
    ).checked()
    tolerances = {}
    for precision, values in _section(raw, "tolerances", {"float32", "float16"}, path).items():
        fields = _section({"t": values}, "t", set(TOLERANCE_FIELDS), path, f"tolerances.{precision}")
        tolerance_with(precision, fields, where=f"{path}: tolerances.{precision}")  # validates
        tolerances[precision] = fields
    return Recipe(
        name=raw["name"],
        source=path,
        model=raw.get("model"),
        attention_heads_per_group=_positive_int(groups.get("attention_heads_per_group"),
                                                "group_sizes.attention_heads_per_group", path),
        ffn_channels_per_group=_positive_int(groups.get("ffn_channels_per_group"),
                                             "group_sizes.ffn_channels_per_group", path),
        limits=limits,
        tolerances=tolerances,
    )


def check_group_sizes(recipe: Recipe, wide_config: dict[str, Any], where: str) -> None:
    """Raise WideError if the exported model's group sizes (wide_config.json `layers`) differ from the recipe's."""
    for i, layer in enumerate(wide_config.get("layers") or []):
        if not isinstance(layer, dict):
            continue
        pairs = (("attention", "heads_per_group", recipe.attention_heads_per_group, "attention_heads_per_group"),
                 ("ffn", "group_size", recipe.ffn_channels_per_group, "ffn_channels_per_group"))
        for part, key, expected, label in pairs:
            actual = (layer.get(part) or {}).get(key)
            if actual is not None and expected is not None and actual != expected:
                raise WideError(
                    f"{where}: layer {i} has {label}={actual}, recipe {recipe.name} says {expected}",
                    hint="export the model that matches the recipe, or use another recipe",
                )
