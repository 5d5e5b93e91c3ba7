"""Every wide_cpu op driven with random and broken arguments (tests/cpu/ops_fuzz.py: random shapes with zero-sized
dims, dtypes, group sizes whose product with the group count wraps, negative sizes, layouts not contiguous, an
`out` overlapping an input, short and full caches, NaN / inf values) in a child process: the child must not be
killed by a signal, and every call must raise or return the PyTorch reference's result. A fixed list of seeds and
a few fresh ones (printed on failure, to rerun), bounded in time."""

from __future__ import annotations

import random

import pytest

from tests.cpu.op_cases import describe, run_child

cpu = pytest.importorskip("wide_export.cpu.ops")
pytestmark = pytest.mark.skipif(not cpu.available(), reason="no C++ compiler: the CPU kernels are not built")

FIXED_SEEDS = list(range(32))
FRESH = 3  # seeds drawn anew each run
BUDGET_S = 75  # the loop stops taking cases after this (its ~2,100 cases take ~20 s on 2 busy cores)


def test_no_op_crashes_and_each_raises_or_matches_the_reference():
    seeds = FIXED_SEEDS + [random.SystemRandom().randrange(2**31) for _ in range(FRESH)]
    res = run_child(f"from tests.cpu.ops_fuzz import main\nmain({seeds}, budget_s={BUDGET_S})", timeout=240)
    last = [line for line in res.stdout.splitlines() if line.startswith("case ")][-1:]
    assert res.returncode >= 0, f"a case crashed the process: {last}\n{describe(res)}"
    failures = [line for line in res.stdout.splitlines() if line.startswith("FAIL ")]
    assert res.returncode == 0 and not failures, f"seeds {seeds}:\n" + "\n".join(failures[:30]) + \
        ("" if failures else "\n" + describe(res))
    assert "ran " in res.stdout and "'valid': 0," not in res.stdout, res.stdout[-500:]
