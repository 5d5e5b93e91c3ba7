"""The `wide` ONNX op set: spec table, PyTorch references, export hooks, ONNX function bodies."""
