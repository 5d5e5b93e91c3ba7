"""Whole flows as library calls: load -> export -> verify -> publish (onnx.py, tp.py)."""
