"""Tensor parallelism for WIDE: per-rank ONNX graphs with DistCollective all-reduces (export.py), their
exact check on CPU with the collectives simulated (verify.py) and balanced FFN placement (balance.py).
docs/distributed.md says how the rank graphs run on GPUs."""
