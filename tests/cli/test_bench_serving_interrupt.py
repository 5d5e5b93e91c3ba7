"""`bench serving` interrupted: SIGTERM / Ctrl-C while it measures stops the tritonserver it started
and removes its temp folder (repository, server work folder); one line, 143 / 130."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from tests.helpers import signal_when_ready


def _servers_of(tmp: Path) -> list[int]:
    """Live tritonserver / python-stub processes whose command line points into `tmp`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if not entry.name.isdigit():
                continue
            cmd = (entry / "cmdline").read_bytes().decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if str(tmp) in cmd and ("tritonserver" in cmd or "triton_python_backend_stub" in cmd) and state != "Z":
            found.append(int(entry.name))
    return found


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["sigterm", "ctrl-c"])
def test_an_interrupted_serving_bench_stops_its_server_and_removes_its_temp_folder(demo_onnx, tmp_path, sig, code):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    try:
        returncode, err = signal_when_ready(
            [sys.executable, "-m", "wide_export", "bench", "serving", "--onnx", str(demo_onnx), "--requests", "400",
             "--staggered", "0", "--rounds", "1", "--clients", "1", "--output", str(tmp_path / "s.json")],
            lambda err: bool(_servers_of(tmp)), sig, env=env, timeout=180, settle=3.0, wait=120)
        assert returncode == code, err
        assert err.strip().splitlines()[-1].startswith(f"interrupted ({signal.Signals(sig).name})"), err
        assert "Traceback" not in err
        assert _servers_of(tmp) == []
        # no wide-bench-serving-*, no wide-triton-* left (.ses: ONNX Runtime's own session-id file, which it
        # writes into the temp folder on every run, interrupted or not)
        assert [p.name for p in tmp.iterdir() if p.name != ".ses"] == []
        assert not (tmp_path / "s.json").exists()
    finally:
        for pid in _servers_of(tmp):
            os.kill(pid, signal.SIGKILL)
