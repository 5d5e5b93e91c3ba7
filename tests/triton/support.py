"""Helpers shared by the Triton tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path


def load_generation_module(version_dir: Path):
    """Import a generated `<model>/1/model.py` as a module (outside Triton)."""
    name = f"wide_generation_{abs(hash(str(version_dir)))}"
    spec = importlib.util.spec_from_file_location(name, version_dir / "model.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the file executes
    spec.loader.exec_module(module)
    return module
