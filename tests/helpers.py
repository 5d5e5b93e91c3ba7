"""Shared test helpers: tiny WIDE checkpoints written to disk through the real code paths."""

from __future__ import annotations

from pathlib import Path

from wide_export.model.synthetic import SyntheticSpec, write_checkpoint


def make_checkpoint(tmp: Path, **spec_kwargs) -> Path:
    lora = spec_kwargs.pop("lora", False)
    spec = SyntheticSpec(**spec_kwargs)
    return write_checkpoint(Path(tmp), spec, lora=lora)


def assert_one_line_error(result, code: int = 2) -> str:
    """A user error as the CLI must report it: exit `code`, no exception, and stderr exactly one
    line `error: <what> (hint: <how to fix>)` with no traceback. Returns that line.

    `result` is a Click/Typer runner Result or a subprocess.CompletedProcess (text mode).
    """
    if hasattr(result, "returncode"):  # subprocess
        got, everything = result.returncode, result.stdout + result.stderr
    else:
        got, everything = result.exit_code, result.output
        assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert got == code, (got, everything)
    assert "Traceback" not in everything, everything
    lines = result.stderr.splitlines()
    assert len(lines) == 1, f"stderr must be exactly one line, got {len(lines)}:\n{result.stderr}"
    assert lines[0].startswith("error: ") and "(hint: " in lines[0], lines[0]
    return lines[0]
