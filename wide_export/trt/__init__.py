"""TensorRT side of wide-export: backend choice, plugin loading, engine build, verification.

Modules, one concern each:
  backend   pick `tensorrt` or `tensorrt_rtx`, import it, prepare its process env
  plugins   find, hash and load libwide_trt_plugins.so into the plugin registry
  recipes   per-model recipes (group sizes, profile limits, tolerances)
  profiles  prefill/decode optimization-profile shapes from the ONNX inputs
  report    which `wide` nodes became plugin layers and which were inlined
  build     parse + build the engine, write OUT/wide_engine.json
  verify    run the engine (Polygraphy TrtRunner) against the PyTorch reference
  oneop     one-node networks per `wide` op (the plugins' unit tests)
  progress  rich bars fed by TensorRT's IProgressMonitor
  _child    run the above in a child process with a prepared environment (RTX)
Documentation: plugins/trt/README.md.
Nothing here imports TensorRT at module import time.
"""
