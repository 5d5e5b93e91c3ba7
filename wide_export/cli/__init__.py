"""The `wide-export` command line: wiring only, the work lives in library modules.

Each command lives in its own module exposing ``register(app)``; modules import
their heavy dependencies inside the command function so ``--help`` is instant.
"""

from __future__ import annotations

import functools
import importlib
import sys

from wide_export.base.errors import WideError

# typer (and the command modules) are imported inside get_app(): `from wide_export.cli import main`,
# what the console script runs first, stays quick, and a Ctrl-C while they import is caught in main().

# One line per command module, in pipeline order (as `--help` lists them); each registers
# its own commands. bench_cmd creates the `bench` group the later bench modules add to.
COMMAND_MODULES = [
    "wide_export.cli.onnx_cmd",
    "wide_export.cli.verify_cmd",
    "wide_export.cli.build_cmd",
    "wide_export.cli.trt_cmd",
    "wide_export.cli.triton_cmd",  # triton + serve
    "wide_export.cli.vllm_cmd",
    "wide_export.cli.generate_cmd",
    "wide_export.cli.gguf_cmd",
    "wide_export.cli.bench_cmd",
    "wide_export.cli.bench_kernels_cmd",
    "wide_export.cli.bench_e2e_cmd",
    "wide_export.cli.bench_vllm_cmd",
    "wide_export.cli.bench_generate_cmd",
    "wide_export.cli.analyze_cmd",
    "wide_export.cli.run_tp_cmd",
]


@functools.lru_cache(maxsize=None)
def get_app():
    """The Typer app with every command module registered (built once, on first use)."""
    import typer

    app = typer.Typer(
        name="wide-export",
        help="Deploy WIDE dynamic-width LLMs: ONNX export with `wide` custom ops, "
        "CUDA kernels, TensorRT plugins and engines, Triton serving.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(app)
    return app


def main(argv: list[str] | None = None) -> None:
    """Console entry point: user errors become one line and exit code 2, Ctrl-C outside a command
    (while the command modules import, say) one line and 130. Without a GPU, Triton's CPU interpreter is switched
    on first, before any command imports torch.onnx or the kernels (kernels/mode.py)."""
    from wide_export.kernels.mode import interpreter_without_gpu

    interpreter_without_gpu()
    try:
        get_app()(args=argv, standalone_mode=True)
    except WideError as err:  # raised outside a command (e.g. while parsing)
        from wide_export.cli.common import report_error

        report_error(err)
        sys.exit(2)
    except KeyboardInterrupt as err:
        from wide_export.base.signals import interrupt_exit_code, interrupt_line

        print(interrupt_line(err), file=sys.stderr)
        sys.exit(interrupt_exit_code())


def __getattr__(name: str):
    """`from wide_export.cli import app` (tests' CliRunner) builds the app lazily."""
    if name == "app":
        return get_app()
    raise AttributeError(name)
