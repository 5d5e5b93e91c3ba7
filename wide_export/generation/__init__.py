"""Generation: the decoding loop and its scheduler (generation/decoding.py), a request's rows and their sampling (rows.py),
text and stop rules (textgen.py), the settings every step shares (settings.py), and the steps: PyTorch
(torch_step.py), the fused CPU kernels (cpu_generator.py), ONNX Runtime (ortstep.py). decoding, rows, textgen,
settings and ortstep are self-contained (numpy only) so a Triton repository copies them beside its model.py."""
