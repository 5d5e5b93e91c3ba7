"""Graph I/O names and axis names (Hugging Face / onnxruntime-genai conventions)."""

from __future__ import annotations

KV_AXES = ["batch_size", "num_key_value_heads", "past_sequence_length", "head_dim"]
PRESENT_AXES = ["batch_size", "num_key_value_heads", "total_sequence_length", "head_dim"]
AXES = {
    "input_ids": ["batch_size", "sequence_length"],
    "attention_mask": ["batch_size", "total_sequence_length"],
    "position_ids": ["batch_size", "sequence_length"],
    "logits": ["batch_size", "sequence_length", "vocab_size"],
}


def input_names(num_layers: int) -> list[str]:
    return ["input_ids", "attention_mask", "position_ids"] + [
        f"past_key_values.{i}.{kv}" for i in range(num_layers) for kv in ("key", "value")
    ]


def output_names(num_layers: int) -> list[str]:
    return ["logits"] + [f"present.{i}.{kv}" for i in range(num_layers) for kv in ("key", "value")]


def axes_of(name: str) -> list[str]:
    """Symbolic axis names of a graph input/output (static axes keep their numbers)."""
    if name.startswith("past_key_values."):
        return KV_AXES
    if name.startswith("present."):
        return PRESENT_AXES
    return AXES[name]


def mask_output_name(layer: int, kind: str) -> str:
    """Name of a router's mask tensor inside the graph (kind: attention | ffn)."""
    return f"/model/layers.{layer}/router_{kind}/mask"
