"""`wide-export vllm`: a folder vLLM serves as it is (`vllm serve OUT`), through the wide-export plugin."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from wide_export.cli.common import (
    AttnGroupOpt, FfnGroupOpt, LoraOpt, LoraScaleOpt, ModelOpt, RouterOpt, user_errors,
)

DTYPES = ("auto", "float32", "float16", "bfloat16")


def register(app: typer.Typer) -> None:
    app.command("vllm")(vllm)


@user_errors
def vllm(
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Folder to create (config.json with a "
                                                   "`wide` section, safetensors, tokenizer files).",
                                                   show_default=False)] = None,
    model: ModelOpt = None,
    router: RouterOpt = None,
    lora: LoraOpt = None,
    lora_scale: LoraScaleOpt = 2.0,
    attn_group_size: AttnGroupOpt = None,
    ffn_group_size: FfnGroupOpt = None,
    dtype: Annotated[Optional[str], typer.Option(
        help="Weights dtype: float32, float16, bfloat16, or auto (the checkpoint's own; float32 for the demo). "
             "Routers are always float32.")] = "auto",
    force: Annotated[bool, typer.Option("--force", help="Replace OUTPUT if it exists.")] = False,
    check: Annotated[Optional[Path], typer.Option(
        "--check", help="Check an existing folder as vLLM will load it (files confined to it, config, shards, "
                        "routers) and write nothing; `wide-vllm serve` runs the same check.",
        show_default=False)] = None,
) -> None:
    """Write a WIDE model as a Hugging Face-style folder that vLLM runs with the wide-export plugin.

    The LoRA is merged, the routers are included (float32), the tokenizer files,
    chat template and generation_config are copied: the folder is shareable as
    it is. Serve it with `vllm serve OUTPUT` where wide-export is installed
    (docs/vllm.md).

    `--check DIR` checks a folder instead (from anywhere: before serving it).

    Exit codes: 0 written (or checked); 2 bad input, nothing written (or a
    folder refused); 130 Ctrl-C, 143 SIGTERM: nothing written, an OUTPUT that
    --force was replacing left as it was.
    """
    from wide_export.base.errors import WideError
    from wide_export.base.outdir import check_output_dir

    if check is not None:
        if output is not None:
            raise WideError("--check reads a folder and --output writes one", "pass one of them")
        _check(check)
        return
    if output is None:
        raise WideError("no --output given", "pass --output DIR to write a folder, or --check DIR to check one")
    if force and output.is_symlink():  # --force replaces folders; a link would be swapped, its target kept
        raise WideError(f"output {output} is a symbolic link (to {output.resolve()})",
                        f"pass the folder itself as --output ({output.resolve()}), or remove the link")
    if dtype not in DTYPES:
        raise WideError(f"unsupported --dtype {dtype}", f"choose one of {', '.join(DTYPES)}")
    from wide_export.checkpoint import Sources

    sources = Sources(model, router, lora, lora_scale, attn_group_size, ffn_group_size)
    check_output_dir(output, force, protect=sources.given_paths())
    _export(output, sources, dtype, force)


def _export(output, sources, dtype, force) -> None:
    from wide_export.base.outdir import atomic_output_dir
    from wide_export.base.progress import Stages
    from wide_export.vllm.export import export_vllm, source_dtype

    stages = Stages()
    if dtype == "auto":
        dtype = source_dtype(sources.model_dir)
    with stages.stage("load"):
        loaded = sources.load(dtype=dtype, progress=stages.update, lazy=True, checksums=False)
    if sources.model_dir is None:  # after the checks: a bad flag stays the only line
        from wide_export.model.demo import DEMO_NAME

        stages.note(f"no --model given: writing the embedded demo model, {DEMO_NAME}")
    if loaded.model_dir is not None:
        from wide_export.export.genai_config import check_genai_sources

        check_genai_sources(loaded)  # an escaping tokenizer file is refused before the weights are written
    with atomic_output_dir(output, force) as staging, stages.stage("write"):
        summary = export_vllm(loaded, staging, dtype, stages)
    from wide_export.vllm.spec import tp_sizes

    cfg = loaded.config
    stages.note(f"wrote {output}: {', '.join(summary['weights'])} ({dtype}, {summary['routers']} router tensors, "
                f"LoRA pairs merged: {loaded.lora_pairs}), {len(summary['text'])} tokenizer file(s)")
    keep = " --dtype float32" if dtype == "float32" else ""  # vLLM's --dtype auto casts float32 down
    stages.note(f"serve it: vllm serve {output}{keep}   (with the CPU wheel: wide-vllm serve {output}; "
                f"tensor_parallel_size: {', '.join(map(str, tp_sizes(cfg)))})")
    if keep:
        stages.note("note: without --dtype float32, vLLM's --dtype auto casts this float32 folder to bfloat16 or "
                    "float16; wide-vllm serve keeps float32 unless given --dtype")
    from wide_export.vllm.compat import cpu_head_dim_note

    note = cpu_head_dim_note(cfg.head_dim)
    if note:
        stages.note(note)
    if not summary["tokenizer"]:
        stages.note(f"warning: {output} has no tokenizer (the model folder has no tokenizer.json, tokenizer.model "
                    "or vocab.json): vLLM fails to start on it unless given skip_tokenizer_init "
                    "(--skip-tokenizer-init) and token ids; copy the tokenizer files into the folder to serve text")


def _check(folder: Path) -> None:
    from wide_export.vllm.check import check_folder

    summary = check_folder(folder)
    tokenizer = "a tokenizer" if summary["tokenizer"] else "no tokenizer (serve with --skip-tokenizer-init)"
    typer.echo(f"ok: {folder}: {len(summary['weights'])} weight file(s), {summary['routers']} router tensors, "
               f"{tokenizer}; every file lies inside the folder")
