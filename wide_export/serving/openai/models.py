"""Which models of a repository the frontend serves, under which names."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from wide_export.base.errors import WideError
from wide_export.generation.settings import SETTINGS_FILE, Settings

VERSION = "1"


@dataclass
class ServedModel:
    """One generation model as the OpenAI API shows it."""

    name: str  # the `model` clients send
    triton_name: str  # the Triton model it runs on
    folder: Optional[Path] = None  # REPO/<model>/1 (tokenizer, generation.json)
    max_model_len: Optional[int] = None
    slots: int = 1  # requests it runs at once: its config.pbtxt max_batch_size (admission.FairQueue)
    text: object = field(default=None, repr=False)  # chat.ModelText, loaded by load_text()

    def load_text(self) -> None:
        from wide_export.serving.openai.chat import ModelText, load_model_text

        self.text = load_model_text(self.folder) if self.folder is not None else ModelText(
            missing="this model has no tokenizer")
        _ = self.text.max_token_chars  # computed once here, not on the event loop at the first request


def _max_batch_size(folder: Path) -> int:
    """The model's max_batch_size from its config.pbtxt (1 when it cannot be read)."""
    try:
        found = re.search(r"^\s*max_batch_size\s*:\s*(\d+)", (folder / "config.pbtxt").read_text(errors="replace"),
                          re.MULTILINE)
    except OSError:
        return 1
    return max(1, int(found.group(1))) if found else 1


def discover(repository: Path, served_model_name: Optional[str] = None) -> list[ServedModel]:
    """The repository's generation models (folders with `1/generation.json`), sorted by name.

    `served_model_name` renames the one model (WideError when there are several).
    """
    repository = Path(repository)
    found = sorted(p.parent.parent for p in repository.glob(f"*/{VERSION}/{SETTINGS_FILE}"))
    if not found:
        raise WideError(f"{repository} holds no generation model (no */{VERSION}/{SETTINGS_FILE})",
                        hint="generate the repository with `wide-export triton`")
    if served_model_name is not None:
        if not served_model_name.strip():
            raise WideError("--served-model-name must not be empty")
        if len(found) > 1:
            raise WideError(f"--served-model-name names one model, and {repository} has {len(found)} generation "
                            f"models ({', '.join(p.name for p in found)})",
                            hint="drop --served-model-name to serve each under its own name")
    models = []
    for folder in found:
        max_len = None
        try:
            max_len = int(Settings.load(str(folder / VERSION)).max_total_tokens)
        except (OSError, ValueError, TypeError):  # unreadable settings: the frontend does not bound the length
            pass
        models.append(ServedModel(name=served_model_name or folder.name, triton_name=folder.name,
                                  folder=folder / VERSION, max_model_len=max_len, slots=_max_batch_size(folder)))
    return models
