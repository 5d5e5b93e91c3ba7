"""`wide-export serve --model DIR --openai-port P`: the OpenAI API in front of the CPU generation path (no
tritonserver): the checkpoint loaded once with the compiled CPU kernels (generation/cpu_generator.py), the frontend of
wide_export.serving.openai with a CpuEngine (serving/cpu_engine.py), served until SIGINT / SIGTERM."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from wide_export.base.errors import WideError


def prepare(model_dir: Path, host: str, port: int, served_model_name: Optional[str] = None, *,
            dtype: str = "float32", threads: Optional[int] = None, limits=None, policy=None,
            router: Optional[Path] = None, lora: Optional[Path] = None, lora_scale: float = 2.0,
            api_key: Optional[str] = None):
    """The frontend (not yet started) over a CpuEngine of the checkpoint: port reserved, model loaded."""
    from wide_export.serving.cpu_engine import CpuEngine
    from wide_export.generation.cpu_generator import CpuGenerator
    from wide_export.serving.openai.models import ServedModel
    from wide_export.serving.openai.runner import Frontend, bind_socket, check_installed

    check_installed(("fastapi", "uvicorn"))  # no tritonclient: no tritonserver behind this API
    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise WideError(f"{model_dir} is not a model folder (no config.json)",
                        hint="pass the WIDE checkpoint's Hugging Face folder as --model")
    name = served_model_name if served_model_name is not None else model_dir.resolve().name
    if not name.strip():
        raise WideError("--served-model-name must not be empty")
    sock = bind_socket(host, port)
    try:
        gen = CpuGenerator.load(model_dir, router=router, lora=lora, lora_scale=lora_scale, dtype=dtype,
                                threads=threads)
        has_tokenizer = gen.encode is not None
        served = ServedModel(name=name, triton_name=name, folder=model_dir if has_tokenizer else None,
                             max_model_len=int(gen.model.config.max_position_embeddings), slots=1)
        served.load_text()
    except BaseException:
        sock.close()
        raise
    return Frontend([served], sock, engine=CpuEngine(gen, name), limits=limits, policy=policy,
                    api_key=api_key), gen


def serve_until_signal(frontend, poll: float = 0.5) -> int:
    """Block until SIGINT / SIGTERM (returns its number; the frontend is stopped) or until the frontend dies
    (WideError)."""
    from wide_export.base.signals import serve_until_signal as until_signal

    return until_signal(poll, frontend.check, frontend.stop)
