"""The `wide-export` command line: wiring only, the work lives in library modules.

Each command lives in its own module exposing ``register(app)``; modules import
their heavy dependencies inside the command function so ``--help`` is instant.
"""

from __future__ import annotations

import importlib
import sys

import typer

from wide_export.errors import WideError

# One line per command module; each registers its own commands.
COMMAND_MODULES = [
    "wide_export.cli.onnx_cmd",
    "wide_export.cli.verify_cmd",
    "wide_export.cli.bench_cmd",
    "wide_export.cli.triton_cmd",
]

app = typer.Typer(
    name="wide-export",
    help="Deploy WIDE dynamic-width LLMs: ONNX export with `wide` custom ops, "
    "CUDA kernels, TensorRT plugins and engines, Triton serving.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

for _name in COMMAND_MODULES:
    importlib.import_module(_name).register(app)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: user errors become one line and exit code 2."""
    try:
        app(args=argv, standalone_mode=True)
    except WideError as err:  # raised outside typer's own handling
        _report(err)
        sys.exit(2)


def _report(err: WideError) -> None:
    from rich.console import Console

    Console(stderr=True, highlight=False).print(f"[bold red]error:[/] {err}", soft_wrap=True)
