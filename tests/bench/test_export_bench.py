"""`wide-export bench export` on the tiny preset: checkpoints written to disk, exported by the real command in
a fresh process, measured, verified (sliced, also in a fresh process), tabulated, saved as JSON and plotted."""

from __future__ import annotations

import json


def test_tiny_sweep_writes_json_and_plot(tmp_path):
    from wide_export.bench.export import run_export_bench

    out = tmp_path / "res" / "export.json"
    rows = run_export_bench(preset="tiny", layers=[1, 3], kinds=("wide",), output=out, work_dir=tmp_path,
                            verify=True)
    data = json.loads(out.read_text())
    expected = [("wide", 1), ("verify", 1), ("wide", 3), ("verify", 3)]
    assert [(r["kind"], r["layers"]) for r in data["runs"]] == expected == [(r["kind"], r["layers"]) for r in rows]
    small, _, big, _ = data["runs"]
    assert 0 < small["weights_mb"] < big["weights_mb"] and small["largest_tensor_mb"] == big["largest_tensor_mb"]
    for r in data["runs"]:
        # the process's own peak, not the parent's: a tiny export or check stays far below a GiB
        assert 100 < r["peak_rss_mb"] < 1500 and r["seconds"] > 0
        assert r["output_mb"] > 0 if r["kind"] == "wide" else r["passed"]
    for r, layers in zip(data["runs"][1::2], (1, 3)):
        assert any(f"in {layers + 2} slices" in note for note in r["notes"]), r["notes"]
    assert out.with_suffix(".png").stat().st_size > 1000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["res"]  # checkpoints and exports removed
