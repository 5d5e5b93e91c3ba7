"""Shared CLI plumbing: option aliases and the user-error wrapper."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Annotated, Callable, Optional, TypeVar

import typer

from wide_export.base.errors import WideError
from wide_export.base.inputs import check_input_file, check_model_folder, check_router_file  # no heavy import

F = TypeVar("F", bound=Callable)


def report_error(err: WideError) -> None:
    """One red line on stderr: what is wrong and the hint."""
    from rich.console import Console
    from rich.markup import escape

    Console(stderr=True, highlight=False).print(f"[bold red]error:[/] {escape(str(err))}", soft_wrap=True)


def user_errors(fn: F) -> F:
    """Turn WideError into one red line + exit 2; Ctrl-C (SIGINT) and SIGTERM into one line saying what is
    left and exit 130 / 143, for every command alike (SIGTERM raises KeyboardInterrupt within the command, so
    its `finally` blocks stop child processes and remove temp folders as for Ctrl-C)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from wide_export.base import streamed
        from wide_export.base.signals import (forget_published, interrupt_exit_code, interrupt_line,
                                         interrupt_on_signals, published)

        forget_published()
        streamed.reset()
        try:
            with interrupt_on_signals():
                return fn(*args, **kwargs)
        except WideError as err:
            streamed.end_line()  # after text streamed to stdout (generate), the error starts a line of its own
            report_error(err)
            raise typer.Exit(2) from None
        except KeyboardInterrupt as err:
            streamed.end_line()  # `...text^C` then the interrupt line on its own line, not glued to the text
            # outputs still there: a folder published into a temp folder the command has removed while
            # unwinding (bench serving's repository) is not a result that was kept
            done = [out for out in published() if Path(out).exists()]
            if done:  # the interrupt came after the output was complete and in place: it stays, a success
                typer.echo(f"interrupted after {done[-1]} was written completely; it is kept", err=True)
                raise typer.Exit(0) from None
            typer.echo(interrupt_line(err), err=True)
            raise typer.Exit(interrupt_exit_code()) from None

    wrapper.reports_interrupts = True  # type: ignore[attr-defined]  # tests/cli: every command has it
    return wrapper  # type: ignore[return-value]


def _checked(check: Callable[[Path], None]) -> Callable:
    """An option callback: `check` the path given while the command line is parsed, before the command body
    imports torch or transformers (seconds), so a wrong path is one line at once; its WideError is reported as
    a command's (one line, exit 2)."""

    def callback(ctx: typer.Context, value: Optional[Path]) -> Optional[Path]:
        if value is not None and not ctx.resilient_parsing:
            try:
                check(value)
            except WideError as err:
                report_error(err)
                raise typer.Exit(2) from None
        return value

    return callback


# Every command's --model / --router / --lora: checked as they are parsed (_checked), in this one place.
model_folder_callback = _checked(check_model_folder)

ModelOpt = Annotated[
    Optional[Path],
    typer.Option(
        "--model",
        help="Hugging Face causal-LM folder (config.json + safetensors). "
        "Omitted: the embedded tiny demo WIDE model.",
        show_default=False,
        callback=model_folder_callback,
    ),
]
RouterOpt = Annotated[
    Optional[Path],
    typer.Option("--router", help="WIDE trainer's router.pth (default: MODEL/router.pth when present).",
                 show_default=False, callback=_checked(check_router_file)),
]
LoraOpt = Annotated[
    Optional[Path],
    typer.Option("--lora", help="Stage-2 LoRA file (lora.pth) to merge into the base weights.",
                 show_default=False, callback=_checked(functools.partial(check_input_file, what="LoRA"))),
]
LoraScaleOpt = Annotated[float, typer.Option("--lora-scale", help="LoRA merge scale (W += B@A*scale).")]
AttnGroupOpt = Annotated[
    Optional[int],
    typer.Option("--attn-group-size", help="Expected query heads per attention group; checked against the router file.",
                 show_default=False),
]
FfnGroupOpt = Annotated[
    Optional[int],
    typer.Option("--ffn-group-size", help="Expected FFN channels per group; checked against the router file.",
                 show_default=False),
]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed for random prompts (and the demo model).")]
SlicedOpt = Annotated[
    Optional[bool],
    typer.Option("--sliced/--whole", help="Verify one layer at a time (ONNX Runtime loads one layer's weights, "
                 "the reference reads them module by module) or the whole model at once. Default: sliced when "
                 "the whole check would need more than 60 % of the available memory.", show_default=False),
]
