"""`wide-export generate`: text from a WIDE checkpoint on CPU, streamed to the terminal (wide_export.cpu)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from wide_export.cli.common import LoraOpt, LoraScaleOpt, ModelOpt, RouterOpt, user_errors


def _ids(text: str) -> list[int]:
    from wide_export.base.errors import WideError

    try:
        ids = [int(t) for t in text.replace(",", " ").split()]
    except ValueError:
        raise WideError(f"--ids {text!r} is not a list of token ids", "e.g. --ids '1,15043,3186'") from None
    if not ids:
        raise WideError("--ids is empty", "e.g. --ids '1,15043,3186'")
    return ids


@user_errors
def generate(
    model: ModelOpt = None,
    router: RouterOpt = None,
    lora: LoraOpt = None,
    lora_scale: LoraScaleOpt = 2.0,
    prompt: Annotated[Optional[str], typer.Option(help="Prompt text (the folder's tokenizer encodes it).")] = None,
    ids: Annotated[Optional[str], typer.Option(help="The prompt as token ids, e.g. '1,15043' (a folder "
                                                    "without a tokenizer).")] = None,
    max_new: Annotated[int, typer.Option(help="New tokens at most (fewer where the end token comes).")] = 64,
    temperature: Annotated[float, typer.Option(help="Below 1e-5 (0): greedy; else sample softmax(logits / T).")] = 0.0,
    top_k: Annotated[int, typer.Option(help="Sample among the k most likely tokens (0: all).")] = 0,
    top_p: Annotated[float, typer.Option(help="Sample within the smallest set of probability >= p.")] = 1.0,
    seed: Annotated[int, typer.Option(help="Seed of the sampler.")] = 0,
    dtype: Annotated[str, typer.Option(help="Weights as float32, bfloat16 or float16.")] = "float32",
    threads: Annotated[Optional[int], typer.Option(help="CPU threads (default: torch's, the cores).")] = None,
    dense: Annotated[bool, typer.Option("--dense", help="Execute every group: the base model, for "
                                                        "comparison.")] = False,
    stats: Annotated[bool, typer.Option("--stats", help="Print prefill and decode tokens/s to stderr at "
                                                        "the end.")] = False,
) -> None:
    """Generate text on CPU with the WIDE kernels (reading only executed groups' weights), streamed as it
    comes. Without --model: the embedded demo model (random weights: its text is noise)."""
    from wide_export.base.errors import WideError

    if (prompt is None) == (ids is None):
        raise WideError("give the prompt as --prompt TEXT or as --ids LIST (one of them)",
                        "wide-export generate --prompt 'Once upon a time'")
    if max_new < 1:
        raise WideError(f"--max-new {max_new} must be >= 1", "e.g. --max-new 64")
    if not temperature >= 0 or top_k < 0 or not 0 < top_p <= 1:  # NaN fails >= too
        raise WideError("--temperature and --top-k must be >= 0 and --top-p in (0, 1]",
                        "e.g. --temperature 0.8 --top-p 0.95")
    prompt_ids = _ids(ids) if ids is not None else None
    from wide_export.generation.cpu_generator import CpuGenerator  # torch: after the argument checks (one line at once)
    from wide_export.generation.torch_step import Sampling

    gen = CpuGenerator.load(model, router=router, lora=lora, lora_scale=lora_scale, dtype=dtype, dense=dense,
                            threads=threads)
    if prompt_ids is None:
        if gen.encode is None:
            raise WideError("the model folder has no tokenizer, so --prompt cannot be encoded",
                            "pass the prompt as --ids, or copy tokenizer.json next to config.json")
        prompt_ids = gen.encode(prompt)
    from wide_export.base import streamed

    out, shown = [], [""]

    def show(_step, chosen):  # through streamed: an interrupt line after the text starts on its own line
        out.append(int(chosen[0]))
        if gen.decode is None:
            streamed.write(f"{out[-1]} ")
        else:  # decode the whole so far: a character may span tokens
            text = gen.decode(out)
            streamed.write(text[len(shown[0]):])
            shown[0] = text

    result = gen.run([prompt_ids], max_new, Sampling(temperature, top_k, top_p, seed), on_token=show)
    streamed.write("\n")
    if stats:
        where = f"CPU kernels ({gen.kernels})" if gen.kernels else "dense path (no CPU kernels)"
        typer.echo(f"{len(prompt_ids)} prompt tokens in {result.prefill_s:.3f} s "
                   f"({result.prefill_tok_s:.1f} tok/s), {result.steps} new, decode "
                   f"{result.decode_tok_s:.2f} tok/s; {where}, {'dense' if dense else 'WIDE'}, {dtype}", err=True)


def register(app: typer.Typer) -> None:
    app.command("generate")(generate)
