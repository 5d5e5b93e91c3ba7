"""Where a WIDE checkpoint is and how its routing is read: the loader's options as one value, passed from the
command line to the library (export, verification, the vLLM folder) instead of five arguments by position."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional


@dataclass(frozen=True)
class Sources:
    model_dir: Optional[Path] = None  # the Hugging Face folder; None: the embedded demo model
    router: Optional[Path] = None  # router.pth (default: MODEL/router.pth)
    lora: Optional[Path] = None  # lora.pth, merged at load
    lora_scale: float = 2.0
    attn_group_size: Optional[int] = None  # routing geometry where the router's shapes leave it open
    ffn_group_size: Optional[int] = None

    def load(self, **options: Any):
        """checkpoint.load_wide_model of these sources; options: dtype, progress, checksums, lazy."""
        from wide_export.checkpoint.loader import load_wide_model

        return load_wide_model(self.model_dir, router=self.router, lora=self.lora, lora_scale=self.lora_scale,
                               attn_group_size=self.attn_group_size, ffn_group_size=self.ffn_group_size, **options)

    def reference_kwargs(self) -> dict[str, Any]:
        """What verification loads its float32 reference from (its load_kwargs)."""
        return {"model_dir": self.model_dir, "router": self.router, "lora": self.lora, "lora_scale": self.lora_scale}

    def given_paths(self) -> tuple:
        """The user's own files and folders (an output must never replace one of them)."""
        return self.model_dir, self.router, self.lora
