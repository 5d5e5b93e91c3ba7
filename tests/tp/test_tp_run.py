"""`wide-export run-tp` (issue 22 item 4, as far as this machine allows): a sharded export run as one process
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

from tests.helpers import assert_one_line_error, make_checkpoint

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
    from wide_export.model.generate import greedy_generate
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
    assert f"--backend nccl needs one CUDA GPU per rank: {_ranks(folder)} rank(s) on this node" in line
    assert "use --backend gloo" in line


def test_an_unknown_backend_is_one_line(sharded):
    folder, _ = sharded
    line = assert_one_line_error(_run_tp(folder, "--backend", "mpi"))
    assert "--backend 'mpi' is not a collective backend" in line


def test_port_puts_the_rendezvous_on_loopback_at_that_port(sharded, monkeypatch):
    """Issue 35: run-tp opened random ports; --port names the ranks' rendezvous port, on 127.0.0.1, and gloo's
    sockets stay on the loopback interface. The ranks still generate the reference's tokens."""
    import socket

    import wide_export.childproc as childproc

    folder, want = sharded
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    seen = []
    real = childproc.run_group

    def spy(cmd, **kw):
        seen.append((list(cmd), dict(kw.get("env") or {})))
        return real(cmd, **kw)

    monkeypatch.setattr(childproc, "run_group", spy)
    result = _run_tp(folder, "--port", str(port))
    assert result.exit_code == 0, result.output
    assert [int(v) for v in result.output.strip().splitlines()[-1].split(",")] == want
    (cmd, env), = seen
    assert f"--rdzv-endpoint=127.0.0.1:{port}" in cmd and "--local-addr=127.0.0.1" in cmd
    assert "--standalone" not in cmd
    assert env["GLOO_SOCKET_IFNAME"] == "lo"
    line = assert_one_line_error(_run_tp(folder, "--port", "70000"))
    assert "--port 70000 is not a TCP port" in line
