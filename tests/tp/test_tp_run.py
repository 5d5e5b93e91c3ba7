"""`wide-export run-tp` (as far as this machine allows): a sharded export run as one process
per rank under torchrun, each with only its rank's graph, the all-reduces done by torch.distributed (gloo)
between the processes. Its greedy tokens must be the UNSHARDED PyTorch reference's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tests.helpers import assert_one_line_error, listening_tcp, make_checkpoint, sigint_default, socket_inodes

PROMPT = [5, 17, 3, 99, 42, 8, 64]
NEW = 8
SPECS = {
    "llama": (2, dict(arch="llama", num_layers=3, num_heads=8, num_kv_heads=4, attn_groups=4, ffn_groups=12, seed=3)),
    "qwen3": (4, dict(arch="qwen3", num_layers=2, num_heads=8, num_kv_heads=4, head_dim=32, attn_groups=4,
                      ffn_groups=12, seed=5)),
}


@pytest.fixture(scope="module", params=sorted(SPECS))
def sharded(request, tmp_path_factory):
    """(tp export folder, the reference's greedy tokens for PROMPT)."""
    from wide_export.checkpoint import load_wide_model
    from wide_export.generation.torch_step import greedy_generate
    from wide_export.tp.export import export_tp
    from wide_export.tp.plan import identity_plan

    tp, spec = SPECS[request.param]
    root = tmp_path_factory.mktemp(f"run-{request.param}")
    ckpt = make_checkpoint(root / "ckpt", **spec)
    loaded = load_wide_model(ckpt, lazy=True, checksums=False)
    export_tp(loaded, root / "tp", identity_plan(loaded.config, tp))
    ref = load_wide_model(ckpt, dtype="float32", checksums=False).model
    want = greedy_generate(ref, torch.tensor([PROMPT]), max_new_tokens=NEW)[0].tolist()
    return root / "tp", want


def _run_tp(folder: Path, *extra: str):
    from wide_export.cli import app

    return CliRunner().invoke(app, ["run-tp", "--onnx", str(folder), "--prompt-ids", ",".join(map(str, PROMPT)),
                                    "--max-new-tokens", str(NEW), *extra])


def test_rank_processes_generate_the_unsharded_references_tokens(sharded):
    folder, want = sharded
    result = _run_tp(folder)
    assert result.exit_code == 0, result.output
    assert [int(v) for v in result.output.strip().splitlines()[-1].split(",")] == want


def test_a_rank_without_its_collective_partner_generates_something_else(sharded, monkeypatch):
    """The same loop with the all-reduce left out (each rank keeps its partial): the reference's tokens are
    not reached, so the test above depends on the processes really exchanging their partial sums."""
    from wide_export.tp.run import RankGenerator

    folder, want = sharded
    got = RankGenerator(folder, 0, len(list(folder.glob("rank*"))), lambda a: a).generate(PROMPT, NEW)
    assert got != want


def test_a_rank_alone_is_refused_in_one_line(sharded):
    folder, _ = sharded
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    done = subprocess.run([sys.executable, "-m", "wide_export.tp.run", "--onnx", str(folder), "--prompt-ids", "1,2"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2 and done.stderr.strip().startswith("error: RANK is not set"), done.stderr
    assert "Traceback" not in done.stderr
    env.update(RANK="0", WORLD_SIZE="3", MASTER_ADDR="127.0.0.1", MASTER_PORT="1")
    done = subprocess.run([sys.executable, "-m", "wide_export.tp.run", "--onnx", str(folder), "--prompt-ids", "1,2"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2 and "3 processes were started" in done.stderr, done.stderr


def test_bad_input_is_one_line(sharded, tmp_path):
    folder, _ = sharded
    from wide_export.cli import app

    runner = CliRunner()
    line = assert_one_line_error(runner.invoke(app, ["run-tp", "--onnx", str(folder), "--prompt-ids", "1,x"]))
    assert "comma-separated" in line
    line = assert_one_line_error(runner.invoke(app, ["run-tp", "--onnx", str(tmp_path), "--prompt-ids", "1"]))
    assert "tp_manifest.json" in line or "manifest" in line
    line = assert_one_line_error(runner.invoke(app, ["run-tp", "--onnx", str(folder), "--prompt-ids", "1,99999999"]))
    assert "vocabulary size" in line


def _ranks(folder: Path) -> int:
    return len(list(folder.glob("rank*")))


def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.gpu
def test_nccl_rank_processes_generate_the_unsharded_references_tokens(sharded):
    """The exchange of the per-rank route on GPUs: each rank process on its own GPU, the all-reduces over
    NCCL (the ONNX Runtime stages stay on the CPU). Runs where torch sees >= one GPU per rank."""
    folder, want = sharded
    if _gpus() < _ranks(folder):
        pytest.skip(f"nccl: {_ranks(folder)} ranks need {_ranks(folder)} GPUs, torch sees {_gpus()}")
    result = _run_tp(folder, "--backend", "nccl")
    assert result.exit_code == 0, result.output
    assert [int(v) for v in result.output.strip().splitlines()[-1].split(",")] == want


def test_nccl_without_a_gpu_per_rank_is_one_line(sharded):
    folder, _ = sharded
    if _gpus() >= _ranks(folder):
        pytest.skip(f"torch sees {_gpus()} GPUs: nccl can run here (the test above runs it)")
    line = assert_one_line_error(_run_tp(folder, "--backend", "nccl"))
    assert "--backend nccl " in line and f"{_ranks(folder)} rank(s)" in line
    assert "--backend gloo" in line


def test_an_unknown_backend_is_one_line(sharded):
    folder, _ = sharded
    line = assert_one_line_error(_run_tp(folder, "--backend", "mpi"))
    assert "--backend 'mpi' " in line


def _descendants(root: int) -> set[int]:
    parent = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, ppid in parent.items() if ppid in frontier} - found
        found |= frontier
    return found


LOOPBACK = ("0100007F:", "00000000000000000000000001000000:")  # 127.0.0.1, ::1 as /proc/net writes them


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads /proc/net (Linux)")
def test_nothing_the_ranks_start_listens_beyond_loopback(sharded):
    """The stores torchrun starts listened on every interface (one on a port of its own). The ranks now meet
    through a file store; every socket any process of the run listens on is bound to 127.0.0.1."""
    folder, want = sharded
    proc = subprocess.Popen([sys.executable, "-m", "wide_export", "run-tp", "--onnx", str(folder), "--prompt-ids",
                             ",".join(map(str, PROMPT)), "--max-new-tokens", str(NEW)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: dict[str, str] = {}
    while proc.poll() is None:
        listening = listening_tcp()
        for pid in _descendants(proc.pid) | {proc.pid}:
            for inode in socket_inodes(pid) & listening.keys():
                seen[inode] = listening[inode]
    out = proc.stdout.read()
    assert proc.returncode == 0, out
    assert [int(v) for v in out.strip().splitlines()[-1].split(",")] == want
    assert seen, "no listening socket of the ranks was seen (gloo's, on loopback): the check saw nothing"
    outside = [addr for addr in seen.values() if not addr.startswith(LOOPBACK)]
    assert not outside, f"listening beyond loopback: {outside}"


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads /proc (Linux)")
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_stops_every_rank_and_removes_the_store(sharded, sig):
    import glob
    import signal
    import tempfile
    import time

    folder, _ = sharded
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "wide-tp-*")))
    proc = subprocess.Popen([sys.executable, "-m", "wide_export", "run-tp", "--onnx", str(folder), "--prompt-ids",
                             ",".join(map(str, PROMPT)), "--max-new-tokens", str(NEW)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=sigint_default)  # a test run in the background inherits SIGINT ignored
    deadline = time.monotonic() + 60
    ranks: set[int] = set()
    while len(ranks) < 2 and time.monotonic() < deadline and proc.poll() is None:
        ranks = {pid for pid in _descendants(proc.pid)
                 if b"wide_export.tp.run" in Path(f"/proc/{pid}/cmdline").read_bytes()}
    assert len(ranks) >= 2, "the ranks did not start"
    proc.send_signal(getattr(signal, sig))
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 128 + getattr(signal, sig), out
    assert "Traceback" not in out, out
    time.sleep(0.5)
    alive = [pid for pid in ranks if Path(f"/proc/{pid}").exists()
             and Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"]
    assert not alive, f"ranks still running: {alive}"
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "wide-tp-*"))) <= before, "the store folder was left"
