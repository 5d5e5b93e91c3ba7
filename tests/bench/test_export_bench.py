"""`wide-export bench export` on the tiny preset: checkpoints written to disk, exported by the real command in
a fresh process, measured, verified (sliced, also in a fresh process), tabulated, saved as JSON and plotted."""

from __future__ import annotations

import json


def test_tiny_sweep_writes_json_and_plot(tmp_path):
    from wide_export.bench.export import run_export_bench

    out = tmp_path / "res" / "export.json"
    ballast = b"\x01" * (1600 << 20)  # this process large (as a test worker may be): not the children's peak
    rows = run_export_bench(preset="tiny", layers=[1, 3], kinds=("wide",), output=out, work_dir=tmp_path,
                            verify=True)
    del ballast
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


def _rows(layers):
    return [{"kind": kind, "layers": n, "weights_mb": 10.0 * n, "largest_tensor_mb": 2.0, "seconds": 1.0 + n,
             "peak_rss_mb": 300.0 + n, "output_mb": 5.0} for n in layers for kind in ("wide", "dense")]


def _figure_of(monkeypatch, rows, tmp_path):
    import matplotlib.figure

    from wide_export.bench.export import plot_results

    saved = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda fig, *a, **k: saved.append(fig))
    plot_results(rows, tmp_path / "export.png")
    return saved[0]


def test_a_one_size_sweep_is_plotted_as_bars_with_a_labelled_legend(monkeypatch, tmp_path):
    """`--preset tiny` is one model size: no one-point lines with piled-up ticks, no unlabelled legend entry."""
    fig = _figure_of(monkeypatch, _rows([2]), tmp_path)
    for ax in fig.axes:
        assert len(ax.patches) == 2  # a bar per export kind
        assert all(len(line.get_xdata()) != 1 for line in ax.lines)
        legend = ax.get_legend()
        assert legend is None or all(t.get_text() and not t.get_text().startswith("_") for t in legend.get_texts())


def test_a_sweep_is_plotted_as_lines(monkeypatch, tmp_path):
    fig = _figure_of(monkeypatch, _rows([1, 3]), tmp_path)
    assert all(len(ax.patches) == 0 and len(ax.lines) >= 2 for ax in fig.axes)


def test_a_work_dir_that_does_not_exist_is_one_line(tmp_path):
    from typer.testing import CliRunner

    from wide_export.cli import app

    result = CliRunner().invoke(app, ["bench", "export", "--preset", "tiny", "--work-dir", str(tmp_path / "nope"),
                                      "--output", str(tmp_path / "r.json")])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: --work-dir {tmp_path / 'nope'} "), lines
    assert "not a folder" in lines[0] and "(hint: " in lines[0], lines
    assert list(tmp_path.iterdir()) == []


def test_sigterm_stops_the_export_and_removes_the_checkpoints(tmp_path):
    """SIGTERM while `wide-export onnx` runs in its child process: one line, exit 143, no wide-bench-* folder
    and no child left (a GB-sized checkpoint at 8B would otherwise stay in the temp folder)."""
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    work = tmp_path / "work"
    work.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "wide_export", "bench", "export", "--preset", "tiny",
                             "--layers", "2", "--no-dense", "--work-dir", str(work), "--output",
                             str(tmp_path / "r.json")], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def children():
        found = []
        for entry in Path("/proc").iterdir():
            try:
                if entry.name.isdigit() and str(work) in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                pass
        return [p for p in found if p != proc.pid]

    try:
        deadline = time.monotonic() + 120
        while not any(work.glob("wide-bench-*/wide-*")):  # the export's output folder: onnx runs now
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "the export never started"
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("interrupted (SIGTERM); ") and "removed" in last, err  # says what it cleaned up
    assert "Traceback" not in err
    assert list(work.iterdir()) == [] and not (tmp_path / "r.json").exists()
    time.sleep(0.5)
    assert children() == []


def test_a_tiny_weight_size_is_labelled_in_mib(monkeypatch, tmp_path):
    """The tiny preset's legend said "weights 0.00 GiB"; 20 MB are "20.0 MiB"."""
    fig = _figure_of(monkeypatch, _rows([2]), tmp_path)
    texts = [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()]
    assert "weights 20.0 MiB" in texts, texts
