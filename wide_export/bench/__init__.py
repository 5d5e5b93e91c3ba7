"""Benchmarks: numbers, tables and plots (never pass/fail tests)."""
