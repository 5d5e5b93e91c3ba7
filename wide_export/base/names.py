"""File names and shared defaults of every stage, in one place (as Polygraphy's constants.py).

Everything that reads or writes these files imports them from here; the
plugin version / namespace live with the op set in ``wide_export.ops.spec``.
The generation model that runs inside Triton's Python backend
(``tritonserver/generation_model.py``) cannot import this package there and gets
its file names through its model config instead.
"""

ONNX_FILE = "model.onnx"
ONNX_DATA_FILE = "model.onnx.data"
WIDE_CONFIG = "wide_config.json"
GENAI_CONFIG = "genai_config.json"
VERIFY_REPORT = "verify_report.json"

ENGINE_FILE = "wide.engine"
ENGINE_MANIFEST = "wide_engine.json"
TIMING_CACHE = "timing.cache"

# a vLLM folder (`wide-export vllm`): config.json's SECTION object carries format FORMAT (vllm/spec.py)
VLLM_FORMAT = "wide-export/vllm"
VLLM_SECTION = "wide"
