"""The embedded default: a tiny Llama-style WIDE model built in code from a seed (its shape and name).

GQA (8 query heads, 2 KV heads), both routers in every layer (4 attention
groups of 2 heads, 12 FFN groups of 16 channels), 3 layers, vocab 256. It lets
`wide-export onnx` run offline in seconds; it is not a trained model. The
model itself is built by ``wide_export.checkpoint.demo.demo_model`` (it goes
through the router checks of the checkpoint package).
"""

from __future__ import annotations

from wide_export.model.synthetic import SyntheticSpec

DEMO_SPEC = SyntheticSpec(arch="llama", num_layers=3, seed=2607)
DEMO_NAME = "wide-demo-tiny-llama (random weights, seed 2607)"
