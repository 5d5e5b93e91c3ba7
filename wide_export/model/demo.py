"""The embedded default: a tiny Llama-style WIDE model built in code from a seed.

GQA (8 query heads, 2 KV heads), both routers in every layer (4 attention
groups of 2 heads, 12 FFN groups of 16 channels), 3 layers, vocab 256. It lets
`wide-export onnx` run offline in seconds; it is not a trained model.
"""

from __future__ import annotations

from wide_export.model.synthetic import SyntheticSpec

DEMO_SPEC = SyntheticSpec(arch="llama", num_layers=3, seed=2607)
DEMO_NAME = "wide-demo-tiny-llama (random weights, seed 2607)"


def demo_model(spec: SyntheticSpec = DEMO_SPEC, dtype=None):
    """A WideForCausalLM with the demo weights, built in memory (no files); routers stay float32."""
    from wide_export.model.build import model_from_states
    from wide_export.model.synthetic import random_base_state, random_router_state

    return model_from_states(spec.hf_config(), random_base_state(spec), random_router_state(spec), dtype)
