"""TensorRT's build phases reach a log when the output is piped: one line per top-level
phase, no bars; the monitor still cancels the build after an interrupt."""

from __future__ import annotations

import types

from wide_export.trt.progress import progress_monitor


class _Base:  # stands in for trt.IProgressMonitor (a pybind class TensorRT-RTX subclasses the same way)
    def __init__(self):
        pass


def test_piped_build_prints_one_line_per_top_level_phase(capsys):
    fake_trt = types.SimpleNamespace(IProgressMonitor=_Base)
    with progress_monitor(fake_trt) as monitor:
        monitor.phase_start("Building engine", None, 3)
        monitor.phase_start("Tactic selection", "Building engine", 40)  # nested: no line of its own
        assert monitor.step_complete("Tactic selection", 0) is True
        monitor.phase_finish("Tactic selection")
        monitor.phase_start("Serializing", None, 1)
    err = capsys.readouterr().err.splitlines()
    assert [line.split(" at ")[0] for line in err] == ["trt: Building engine (3 steps)", "trt: Serializing (1 steps)"]
    assert all(line.endswith(" s") for line in err)


def test_the_monitor_cancels_after_an_interrupt(monkeypatch, capsys):
    from wide_export.trt import progress

    monkeypatch.setattr(progress, "interrupted", lambda: True)
    with progress_monitor(types.SimpleNamespace(IProgressMonitor=_Base)) as monitor:
        monitor.phase_start("Building engine", None, 3)
        assert monitor.step_complete("Building engine", 0) is False


def test_disabled_or_unavailable_gives_no_monitor():
    with progress_monitor(types.SimpleNamespace(IProgressMonitor=_Base), enabled=False) as monitor:
        assert monitor is None
    with progress_monitor(types.SimpleNamespace()) as monitor:
        assert monitor is None
