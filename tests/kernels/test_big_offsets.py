"""Row offsets past 2^31 elements (int64 offsets where products can pass 2^31).

A long prefill makes x ([M, K]) or y ([M, N]) larger than 2^31 elements (128k tokens x 28672 FFN
channels is 3.7e9); int32 row offsets then wrap to addresses outside the tensor. Each case runs one
kernel in Triton's interpreter on rows that start 2^31 elements (and more) into a 4 GiB, mostly untouched storage
(big_offsets_child.py) and compares it with the PyTorch reference on a contiguous copy. In a child
process, because the int32 version does not fail politely: it reads outside the tensor and crashes.
Seen failing (a segfault in each of the six) with `_row_offsets` computing in int32.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CHILD = Path(__file__).with_name("big_offsets_child.py")
KERNELS = ("tile_n", "tile_k", "grouped_n", "grouped_k", "apply_mask", "router")


@pytest.mark.parametrize("kernel", KERNELS)
def test_rows_past_int32_offsets(kernel):
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, str(CHILD), kernel], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, (f"{kernel} on rows past 2^31 elements exited {proc.returncode} "
                                  f"(a negative code is a signal: an address outside the tensor)\n{proc.stderr[-2000:]}")
    error = json.loads(proc.stdout.strip().splitlines()[-1])["error"]
    # fp16 outputs of float32 sums over K = 64; the router: the number of decisions that differ
    assert error <= (0 if kernel == "router" else 2e-3), error
