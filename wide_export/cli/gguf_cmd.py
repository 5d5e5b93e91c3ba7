"""`wide-export gguf`: the dense base model as one GGUF file for llama.cpp (routers left out, LoRA merged)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from wide_export.cli.common import LoraOpt, LoraScaleOpt, ModelOpt, RouterOpt, user_errors


def register(app: typer.Typer) -> None:
    app.command("gguf")(gguf)


@user_errors
def gguf(
    out: Annotated[Path, typer.Option("--out", "-o", help="GGUF file to write.", show_default=False)],
    model: ModelOpt = None,
    router: RouterOpt = None,
    lora: LoraOpt = None,
    lora_scale: LoraScaleOpt = 2.0,
    dtype: Annotated[str, typer.Option(help="Matrices as f32, f16 or bf16 (norms and biases stay f32).")] = "f32",
    force: Annotated[bool, typer.Option("--force", help="Replace OUT if it exists.")] = False,
    tokenizer_pre: Annotated[Optional[str], typer.Option(
        "--tokenizer-pre", metavar="NAME", show_default=False,
        help="llama.cpp's pre-tokenizer for a byte-level BPE tokenizer.json (gpt-2, llama-bpe, qwen2, ...), "
             "where it is not recognised; none: write token ids only.")] = None,
) -> None:
    """Write the dense base model of a WIDE checkpoint as a GGUF file that llama.cpp runs.

    The same weights as the WIDE model (LoRA merged as every export merges it), every group executed:
    what `bench generate` runs in llama.cpp beside WIDE. The routers are checked, not written.
    A tokenizer.json of the model folder becomes the file's vocabulary; without one (the demo model)
    llama.cpp runs on token ids only. The pre-tokenizer of a byte-level BPE is recognised as llama.cpp's
    converter does (or from tokenizer.json); one that is not is refused: name it with --tokenizer-pre.
    Needs the `gguf` package (the `llamacpp` or `test` extra).

    Exit codes: 0 written; 2 bad input, nothing written; 130 Ctrl-C, 143 SIGTERM: nothing written.
    """
    from wide_export.base.errors import WideError
    from wide_export.export.gguf import DTYPES, check_gguf_output, require_gguf, write_gguf
    from wide_export.base.progress import Stages

    if dtype not in DTYPES:
        raise WideError(f"unsupported --dtype {dtype}", f"choose one of {', '.join(DTYPES)}")
    require_gguf()
    check_gguf_output(out, force, protect=(model, router, lora))
    stages = Stages()
    with stages.stage("write"):
        result = write_gguf(model, out, dtype, force=force, router=router, lora=lora, lora_scale=lora_scale,
                            progress=stages.update, tokenizer_pre=tokenizer_pre)
    if model is None:
        from wide_export.model.demo import DEMO_NAME

        stages.note(f"no --model given: wrote the embedded demo model, {DEMO_NAME}")
    stages.note(f"wrote {result.path}: llama.cpp architecture {result.arch}, {result.tensors} tensors ({result.dtype}), "
                f"{result.bytes / 2**20:.1f} MiB, LoRA pairs merged: {result.lora_pairs}, vocabulary {result.vocab}")
    for note in result.notes:
        stages.note(f"note: {note}")
