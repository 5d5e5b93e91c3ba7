"""The paths a user gives to read from (a model folder, router / LoRA files), checked for existence and kind with
nothing heavy imported: the CLI checks them while it parses its options (cli/common.py), before a command
imports torch, and the library's readers (checkpoint/hf.py, checkpoint/torchfile.py) refuse with the same lines."""

from __future__ import annotations

from pathlib import Path

from wide_export.base.errors import WideError


def check_model_folder(model_dir: Path) -> None:
    """A Hugging Face folder: a directory with a config.json (what config.json says is read later)."""
    model_dir = Path(model_dir)
    if model_dir.exists() and not model_dir.is_dir():
        raise WideError(f"--model {model_dir} is a file, not a folder",
                        f"pass the Hugging Face model folder that holds it: --model {model_dir.parent}")
    if not model_dir.is_dir():
        raise WideError(f"model folder not found: {model_dir}", "pass --model DIR, a Hugging Face model folder")
    if not (model_dir / "config.json").is_file():
        from wide_export.base.folders import elsewhere

        raise WideError(f"{model_dir} has no config.json", elsewhere(model_dir, "model")
                        or "pass a Hugging Face causal-LM folder (config.json + *.safetensors)")


def check_router_file(router: Path) -> None:
    """The router.pth to read (given, or the model folder's default) is there."""
    if not Path(router).is_file():
        raise WideError(f"no router file: {router} does not exist",
                        "pass --router PATH (the WIDE trainer's router.pth) or put router.pth in the model folder")


def check_input_file(path: Path, what: str) -> None:
    """A file to read (`what`: router, LoRA) is there."""
    if not Path(path).is_file():
        raise WideError(f"{what} file not found: {path}", f"check the path given for the {what} file")
