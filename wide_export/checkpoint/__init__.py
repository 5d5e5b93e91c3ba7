"""Loading real WIDE checkpoints: HF folder + router.pth (+ lora.pth), or the demo model."""

from wide_export.checkpoint.loader import LoadedModel, load_wide_model

__all__ = ["LoadedModel", "load_wide_model"]
