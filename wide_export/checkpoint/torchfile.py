"""Safe reading of the trainer's torch.save files (router.pth, lora.pth)."""

from __future__ import annotations

import os
import re
import warnings
import zipfile
from pathlib import Path

from wide_export.base.errors import WideError

LAYER_KEY = re.compile(r"(?:^|\.)model\.layers\.(\d+)\.(.+)$")


def load_failure(err: BaseException, limit: int = 160) -> str:
    """Why torch.load refused a file, as one whole clause: torch's weights-only message is a paragraph about
    its defaults whose reason (`Unsupported operand 149`) comes last; anything else is cut at a word."""
    text = str(err).strip()
    if "Weights only load failed" in text:
        reason = re.search(r"WeightsUnpickler error:\s*(.+?)\s*(?:\n\n|$)", text, re.S)
        detail = f": {' '.join(reason.group(1).split())}" if reason else ""
        return f"torch.load(weights_only=True) refused its content{detail}"[:limit * 2]
    first = text.splitlines()[0] if text else type(err).__name__
    if len(first) <= limit:
        return first
    return first[:limit].rsplit(" ", 1)[0].rstrip(" ,;:") + " ..."


def load_tensor_dict(path: Path, what: str) -> dict:
    """torch.load(weights_only=True) of a dict of tensors, with one-line errors."""
    import torch

    from wide_export.base.inputs import check_input_file

    path = Path(path)
    check_input_file(path, what)  # the same line the CLI gives while parsing --router / --lora
    is_zip = _is_zip(path)
    if is_zip:
        check_inflated_size(path, what)
    try:
        with warnings.catch_warnings():  # torch's "Detected pickle protocol 4" warning is a second line
            warnings.simplefilter("ignore")
            obj = torch.load(path, map_location="cpu", weights_only=True, mmap=is_zip)
    except Exception as err:  # pickle, zip and unpickler-policy errors all mean the same to a user
        raise WideError(
            f"cannot read {what} file {path}: not a torch.save file of tensors ({load_failure(err)})",
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


# torch.save writes its zip archive uncompressed (entries stored, so that torch.load(mmap=True) maps
# them), so a real router.pth / lora.pth inflates to its own size. A compressed archive -- re-zipped by
# some tool -- is still read, but may expand by at most this much: a zip bomb (14 MB on disk, 3 GiB of
# zeros inflated) is refused before torch.load allocates anything. $WIDE_PTH_MAX_INFLATE raises it.
MAX_INFLATE_BYTES = int(os.environ.get("WIDE_PTH_MAX_INFLATE", 64 << 20))


def check_inflated_size(path: Path, what: str) -> None:
    """Refuse a zip archive whose entries inflate to more than the file's size + MAX_INFLATE_BYTES
    (sizes read from the zip's central directory, which torch's reader also allocates by)."""
    hint = f"pass the {what} .pth written by the WIDE trainer (torch.save)"
    try:
        with zipfile.ZipFile(path) as archive:
            inflated = sum(info.file_size for info in archive.infolist())
    except (zipfile.BadZipFile, OSError, ValueError) as err:
        raise WideError(f"cannot read {what} file {path}: not a torch.save file of tensors (a damaged zip "
                        f"archive: {err})", f"pass the {what} .pth written by the WIDE trainer") from None
    size = path.stat().st_size
    if inflated > size + MAX_INFLATE_BYTES:
        raise WideError(f"{what} file {path} inflates to {inflated} bytes from {size} on disk, more than "
                        f"{MAX_INFLATE_BYTES >> 20} MiB of expansion (a zip bomb?)",
                        f"{hint}; set WIDE_PTH_MAX_INFLATE=BYTES to allow more")


def _is_zip(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"PK\x03\x04"
