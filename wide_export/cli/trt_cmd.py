"""`wide-export trt`: build the prefill + decode TensorRT engine from an exported ONNX folder."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from wide_export.cli.common import user_errors


@user_errors
def trt(
    onnx: Annotated[Path, typer.Option("--onnx", help="Folder written by `wide-export onnx`.")],
    output: Annotated[Path, typer.Option(
        "--output", "-o", help="Engine folder to write (an existing engine folder is replaced, reusing its "
        "timing cache; any other existing folder needs --force).")],
    fp16: Annotated[bool, typer.Option(
        "--fp16", help="Build fp16. A float32 export is converted first (onnxconverter-common; routers, norm "
        "statistics, rotary angles, softmax and logits stay float32, as in `wide-export onnx --dtype float16`); "
        "the network is built strongly typed (no FP16 builder flag, as TensorRT 11 requires).")] = False,
    bf16: Annotated[bool, typer.Option(
        "--bf16", help="Build bfloat16: from a `--dtype bfloat16` export, or a float32 export converted as "
        "--fp16 converts it (the same float32 islands), strongly typed.")] = False,
    plugins: Annotated[Optional[Path], typer.Option(
        "--plugins", help="libwide_trt_plugins.so to load (default: $WIDE_TRT_PLUGIN_LIB). Without it the "
        "`wide` nodes are inlined from their function bodies.", show_default=False)] = None,
    max_batch: Annotated[Optional[int], typer.Option("--max-batch", help="Largest batch (default 4 or the recipe's).",
                                                     show_default=False)] = None,
    max_input_len: Annotated[Optional[int], typer.Option(
        "--max-input-len", help="Longest prompt in the prefill profile (default 128 or the recipe's).",
        show_default=False)] = None,
    max_seq_len: Annotated[Optional[int], typer.Option(
        "--max-seq-len", help="Longest total sequence (prompt + generated) in the decode profile "
        "(default 256 or the recipe's).", show_default=False)] = None,
    recipe: Annotated[Optional[str], typer.Option(
        "--recipe", help="Recipe file or shipped name (wide_export/recipes/: llama-3.1-8b, qwen3-8b).", show_default=False)] = None,
    backend: Annotated[Optional[str], typer.Option(
        "--backend", help="auto, tensorrt or tensorrt_rtx (default auto: the first that imports).",
        show_default=False)] = None,
    timing_cache: Annotated[Optional[Path], typer.Option(
        "--timing-cache", help="Timing cache to reuse and update (default: OUTPUT/timing.cache).",
        show_default=False)] = None,
    compute_capability: Annotated[Optional[str], typer.Option(
        "--compute-capability", help="TensorRT-RTX target, e.g. SM89 (default: the GPU here, SM89 without one).",
        show_default=False)] = None,
    mask_outputs: Annotated[bool, typer.Option(
        "--mask-outputs", help="Also output the router masks, so `verify --engine` measures decision agreement "
        "(a verification engine: not for `wide-export triton`).")
    ] = False,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing --output folder.")] = False,
) -> None:
    """Build OUTPUT/wide.engine (profile 0 prefill, profile 1 decode) and OUTPUT/wide_engine.json."""
    from rich.console import Console
    from rich.table import Table

    from wide_export.base.names import ENGINE_MANIFEST
    from wide_export.trt.build_engines import build_engine, summary_rows
    from wide_export.trt.plugins import default_plugin_library

    limits = {"max_batch": max_batch, "max_input_len": max_input_len, "max_seq_len": max_seq_len}
    manifest = build_engine(
        onnx, output, backend=backend, fp16=fp16, bf16=bf16, plugins=plugins or default_plugin_library(),
        limits={k: v for k, v in limits.items() if v is not None}, recipe=recipe, timing_cache=timing_cache,
        compute_capability=compute_capability, mask_outputs=mask_outputs, force=force,
    )
    console = Console(highlight=False)
    table = Table(title="wide nodes", title_justify="left")
    for col in ("op", "plugin layers", "inlined bodies"):
        table.add_column(col, justify="left" if col == "op" else "right")
    for row in summary_rows(manifest):
        table.add_row(*row)
    console.print(table)
    trt_info = manifest["tensorrt"]
    engine = manifest["engines"][0]
    console.print(f"[green]built[/] {output / engine['file']} with {trt_info['flavour']} {trt_info['version']} "
                  f"({manifest['precision']}, {engine['size_bytes'] / 2**20:.1f} MiB, {manifest['build_seconds']} s)")
    if not manifest["plugins"]:
        console.print("note: no plugin library loaded: every `wide` node runs as its inlined function body")
    for line in limit_lines(manifest, {k for k, v in limits.items() if v is not None}, recipe):
        console.print(line)
    console.print(f"manifest {output / ENGINE_MANIFEST}")


def limit_lines(manifest: dict, flags: set[str], recipe: Optional[str]) -> list[str]:
    """The profile limits the engine was built with (and where each came from), then each profile's ranges."""
    source = {k: "flag" if k in flags else (f"recipe {recipe}" if recipe else "default") for k in manifest["limits"]}
    lines = ["limits: " + ", ".join(f"{k.replace('_', '-')} {v} ({source[k]})" for k, v in manifest["limits"].items())]
    for prof in manifest["engines"][0]["profiles"]:
        ids = prof["shapes"]["input_ids"]
        past = next(v for k, v in prof["shapes"].items() if k.startswith("past_key_values."))
        (b0, t0), (b1, t1) = ids["min"], ids["max"]
        tokens = f"{t0} token" if t0 == t1 == 1 else f"tokens {t0}..{t1}"
        pasts = f"{past['min'][2]}" if past["min"][2] == past["max"][2] else f"{past['min'][2]}..{past['max'][2]}"
        lines.append(f"profile {prof['index']} {prof['name']}: batch {b0}..{b1}, {tokens}, past {pasts}")
    return lines


def register(app: typer.Typer) -> None:
    """Add `trt`."""
    app.command("trt", no_args_is_help=True)(trt)
