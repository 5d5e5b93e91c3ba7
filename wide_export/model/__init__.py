"""The PyTorch reference of a WIDE model: config, architecture table, modules, generation."""
