"""Atomic output folders: write into a hidden temp folder beside OUT, rename at the end.

A failure or Ctrl-C leaves nothing behind; an existing OUT is refused unless
`force`, and then replaced only once the new one is complete.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from wide_export.errors import WideError


def check_output_dir(output: Path, force: bool, protect: tuple[Path | None, ...] = ()) -> Path:
    """Refuse an existing OUT (unless force) or an unwritable parent, before any work starts.

    `protect`: the user's inputs; an OUT that is one of them or contains one is refused even
    with force, since replacing OUT would delete them.
    """
    output = Path(output).absolute()
    for given in filter(None, protect):
        given = Path(given).resolve()
        if given == output.resolve() or output.resolve() in given.parents:
            raise WideError(f"output {output} would replace your input {given}",
                            "choose an --output outside the input folders")
    if output.exists() and not force:
        raise WideError(f"output {output} already exists", "pass --force to replace it, or choose another --output")
    if output.exists() and not output.is_dir():
        raise WideError(f"output {output} exists and is not a folder", "choose another --output")
    parent = output.parent
    probe = parent
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise WideError(f"cannot write to {parent}: permission denied or not a folder",
                        "choose an --output in a folder you can write to")
    return output


@contextlib.contextmanager
def atomic_output_dir(output: Path, force: bool = False) -> Iterator[Path]:
    """Yield a temp folder; on success it becomes `output`, on any error it is removed."""
    output = check_output_dir(output, force)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output.name}.tmp-", dir=output.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes 0700; the result should look like a mkdir
    try:
        yield tmp
        if output.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{output.name}.old-", dir=output.parent))
            os.replace(output, old / output.name)
            os.replace(tmp, output)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, output)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
