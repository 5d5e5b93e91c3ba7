"""Safe reading of the trainer's torch.save files (router.pth, lora.pth)."""

from __future__ import annotations

import re
from pathlib import Path

from wide_export.errors import WideError

LAYER_KEY = re.compile(r"(?:^|\.)model\.layers\.(\d+)\.(.+)$")


def load_tensor_dict(path: Path, what: str) -> dict:
    """torch.load(weights_only=True) of a dict of tensors, with one-line errors."""
    import torch

    path = Path(path)
    if not path.is_file():
        raise WideError(f"{what} file not found: {path}", f"check the path given for the {what} file")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=_is_zip(path))
    except Exception as err:  # pickle, zip and unpickler-policy errors all mean the same to a user
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise WideError(
            f"cannot read {what} file {path}: not a torch.save file of tensors ({first[:160]})",
            f"pass the {what} .pth written by the WIDE trainer",
        ) from None
    if isinstance(obj, dict) and "state_dict" in obj and isinstance(obj["state_dict"], dict):
        obj = obj["state_dict"]
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise WideError(f"{what} file {path} does not hold a dict of tensors",
                        f"pass the {what} .pth written by the WIDE trainer")
    return obj


def strip_to_layer_keys(sd: dict) -> dict[tuple[int, str], object]:
    """{(layer, rest-of-key): tensor} with any wrapper prefix before `model.layers.` removed."""
    out = {}
    for key, value in sd.items():
        m = LAYER_KEY.search(key)
        if m:
            out[(int(m.group(1)), m.group(2))] = value
    return out


def _is_zip(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"PK\x03\x04"
