"""Ctrl-C while `wide-export generate` streams text: the interrupt line starts on a line of its own, after the
text streamed so far (it was glued to it: `...ne^Cinterrupted (SIGINT); nothing was written`).

The real command in a child process, stdout and stderr on one pipe as on a terminal; the generator is a
stand-in that streams three tokens and then gets a real SIGINT (the CPU kernels' build is not the point)."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers import sigint_default

SCRIPT = """
import os, signal, sys, time
from wide_export.generation import cpu_generator as generation

class Streaming:
    encode = None
    kernels = ""
    decode = staticmethod(lambda ids: "".join(["Once", " upon", " a"][:len(ids)]))

    def run(self, prompts, max_new, sampling, on_token):
        for step in range(3):
            on_token(step, [7])
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C in the middle of a line of text
        time.sleep(30)

generation.CpuGenerator.load = classmethod(lambda cls, *a, **k: Streaming())
from wide_export.cli import main
main(sys.argv[1:])
"""


def _interrupted_generate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SCRIPT, "generate", *args, "--max-new", "8"],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120,
                          preexec_fn=sigint_default)


def test_the_interrupt_line_after_streamed_text_is_on_its_own_line():
    done = _interrupted_generate("--ids", "1,2,3")
    assert done.returncode == 130, done.stdout
    lines = done.stdout.splitlines()
    assert lines[-1].startswith("interrupted (SIGINT)"), done.stdout  # a line of its own
    assert lines[-2] == "Once upon a", done.stdout  # the text streamed, its line ended, nothing else on it
    assert done.stdout.endswith("\n")  # the interrupt line ends too
