"""An interrupt is handled "the same way for every command": every command the CLI
registers (bench subcommands included) runs inside cli.common.user_errors, which turns SIGINT / SIGTERM into
one line and 130 / 143 (its behaviour: tests/cli/test_interrupts.py, test_build_progress.py, ...). A command
registered without it would print a traceback and exit 1 on Ctrl-C.

The wording is the contract here: test_a_command_interrupted_by_sigterm_says_so_and_exits_143 pins the interrupt
line whole (`interrupted (SIGTERM); nothing was written`); the other interrupt tests assert the signal it names,
the exit code and what is left on disk."""

from __future__ import annotations


def _commands(app, prefix: str = ""):
    for c in app.registered_commands:
        yield prefix + (c.name or c.callback.__name__.replace("_", "-")), c.callback
    for g in app.registered_groups:
        yield from _commands(g.typer_instance, f"{prefix}{g.name} ")


def test_every_command_turns_interrupts_into_one_line_and_130_143():
    from wide_export.cli import get_app

    commands = dict(_commands(get_app()))
    assert {"onnx", "verify", "build", "trt", "triton", "serve", "analyze", "run-tp", "bench export",
            "bench serving", "bench kernels", "bench e2e"} <= set(commands)
    unwrapped = [name for name, cb in commands.items() if not getattr(cb, "reports_interrupts", False)]
    assert unwrapped == []


def test_a_command_interrupted_by_sigterm_says_so_and_exits_143():
    """The wrapper itself, on a command that is interrupted while it runs (SIGTERM raises inside it)."""
    import os
    import signal
    import time

    import typer
    from typer.testing import CliRunner

    from wide_export.cli.common import user_errors

    cleaned = []

    @user_errors
    def work() -> None:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises here
            raise AssertionError("SIGTERM did not interrupt the command")
        finally:
            cleaned.append(True)

    app = typer.Typer()
    app.command()(work)
    result = CliRunner().invoke(app, [])
    assert result.exit_code == 143, result.output
    # the wording is the contract here (module docstring): the interrupt line, whole
    assert result.output.strip().splitlines() == ["interrupted (SIGTERM); nothing was written"]
    assert cleaned == [True]
