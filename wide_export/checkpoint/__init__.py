"""Loading real WIDE checkpoints: HF folder + router.pth (+ lora.pth), or the demo model."""

from wide_export.checkpoint.loader import LoadedModel, load_wide_model
from wide_export.checkpoint.options import Sources

__all__ = ["LoadedModel", "Sources", "load_wide_model"]
