"""Verification of exported artifacts against the PyTorch reference (Polygraphy comparator)."""
