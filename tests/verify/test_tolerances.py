"""The tolerances in use are the ones README's "Tolerances" table documents (an independent statement of them)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from wide_export.verify.tolerances import TOLERANCES, Tolerance, tolerance_for

README = Path(__file__).resolve().parents[2] / "README.md"
ROW = re.compile(r"^\| (\w+) \| atol ([\d.e-]+), rtol ([\d.e-]+), (every element|on the mean error) \| "
                 r">= (\d+) % agreement per router, no flip whose reference margin .*?> ([\d.e-]+) \|$")
STAT = {"every element": "elemwise", "on the mean error": "mean"}


def documented() -> dict[str, Tolerance]:
    rows = {}
    for line in README.read_text().splitlines():
        m = ROW.match(line)
        if m:
            dtype, atol, rtol, stat, agree, margin = m.groups()
            rows[dtype] = Tolerance(float(atol), float(rtol), STAT[stat], int(agree) / 100, float(margin))
    return rows


def test_readme_documents_every_dtype():
    assert sorted(documented()) == sorted(TOLERANCES) == ["bfloat16", "float16", "float32"]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_tolerance_of_each_dtype_is_the_documented_one(dtype):
    assert tolerance_for(dtype) == documented()[dtype]
    assert tolerance_for(dtype).to_dict() == {k: getattr(documented()[dtype], k)
                                              for k in ("atol", "rtol", "stat", "min_agreement", "flip_margin")}


def test_an_unknown_dtype_has_no_tolerance():
    with pytest.raises(KeyError):
        tolerance_for("int8")
