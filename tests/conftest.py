"""Markers `gpu`, `trt`, `slow`: skipped with a reason when the capability is missing."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest

from wide_export.kernels.mode import interpreter_without_gpu

interpreter_without_gpu()  # first: without a GPU, Triton's interpreter on before anything imports triton


@functools.lru_cache(maxsize=None)
def _has_gpu() -> tuple[bool, str]:
    try:
        import torch
    except ImportError:
        return False, "torch is not installed"
    if not torch.cuda.is_available():
        return False, "no CUDA GPU on this machine"
    return True, ""


@functools.lru_cache(maxsize=None)
def _has_trt() -> tuple[bool, str]:
    from importlib.util import find_spec

    for mod in ("tensorrt", "tensorrt_rtx"):
        if find_spec(mod) is not None:
            return True, ""
    return False, "neither tensorrt nor tensorrt_rtx is importable"


def _has_vllm() -> tuple[bool, str]:
    from importlib.util import find_spec

    if find_spec("vllm") is not None:
        return True, ""
    return False, ("vllm is not installed here: the vLLM tests run in their own environment "
                   "(README: .venv-vllm, pip install -e '.[vllm-test]')")


@functools.lru_cache(maxsize=None)
def _has_llamacpp() -> tuple[bool, str]:
    from wide_export.bench.llamacpp import unavailable_reason

    why = unavailable_reason()
    return why is None, (why or "").replace("llama.cpp rows skipped: ", "")


def pytest_collection_modifyitems(config, items):
    checks = {
        "gpu": _has_gpu,
        "trt": _has_trt,
        "vllm": _has_vllm,
        "llamacpp": _has_llamacpp,
        "slow": lambda: (os.environ.get("WIDE_RUN_SLOW") == "1", "slow test; set WIDE_RUN_SLOW=1 to run"),
    }
    for item in items:
        for name, check in checks.items():
            # tests/vllm (tests/llamacpp) also holds tests that need no vLLM (llama.cpp): for those markers the
            # marker decides, not the folder's name among the item's keywords
            marked = (item.get_closest_marker(name) is not None if name in ("vllm", "llamacpp")
                      else name in item.keywords)
            if marked:
                ok, why = check()
                if not ok:
                    item.add_marker(pytest.mark.skip(reason=f"{name}: {why}"))


@pytest.fixture(scope="session")
def demo_onnx(tmp_path_factory) -> Path:
    """The default demo model exported once per session by the real `wide-export onnx` command.

    $WIDE_TEST_ONNX_DIR reuses an existing export (the export costs ~30 s on 2 cores).
    """
    given = os.environ.get("WIDE_TEST_ONNX_DIR")
    if given:
        return Path(given)
    from wide_export.base.cli_process import export_onnx_cli

    return export_onnx_cli(tmp_path_factory.mktemp("demo") / "onnx")


@pytest.fixture(scope="session")
def text_ckpt(tmp_path_factory):
    """A checkpoint with a tokenizer and chat template whose greedy chat answer holds a character
    split across tokens and ends at an eos id of its generation_config.json (tests/text_checkpoint.py)."""
    from tests.text_checkpoint import write_text_checkpoint

    return write_text_checkpoint(tmp_path_factory.mktemp("text_ckpt"))


@pytest.fixture(scope="session")
def text_repo(text_ckpt, tmp_path_factory) -> Path:
    """`wide-export onnx --model CKPT` then `wide-export triton --streaming`, the real commands."""
    import subprocess
    import sys

    out = tmp_path_factory.mktemp("text_export")
    cli = [sys.executable, "-c", "from wide_export.cli import main; main()"]
    for args in (["onnx", "--model", str(text_ckpt.folder), "--output", str(out / "onnx"), "--no-verify"],
                 ["triton", "--onnx", str(out / "onnx"), "--output", str(out / "repo"), "--streaming"]):
        done = subprocess.run(cli + args, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
    return out / "repo"


@pytest.fixture(scope="session")
def text_server(text_repo):
    """A real tritonserver on 127.0.0.1 serving the text repository, metrics on."""
    from wide_export.tritonserver import TritonServer
    from wide_export.tritonserver.server import free_port

    server = TritonServer(text_repo, metrics_port=free_port("127.0.0.1"))
    server.start(timeout=120)
    yield server
    code = server.stop()
    assert code == 0, f"tritonserver did not stop cleanly (code {code}):\n{server.log_tail(10)}"


def pytest_terminal_summary(terminalreporter):
    """One line saying how many kernel cases ran (not skipped), and where: the issue asks for the count.
    Here, not in tests/kernels/conftest.py: under pytest-xdist only the root conftest reaches the
    controller, which writes the summary from every worker's reports."""
    stats = terminalreporter.stats
    ran = [r for r in stats.get("passed", []) + stats.get("failed", [])
           if r.when == "call" and "tests/kernels/test_kernels.py" in r.nodeid]
    skipped = [r for r in stats.get("skipped", []) if "tests/kernels/test_kernels.py" in r.nodeid]
    if ran or skipped:
        gpu = sum("_gpu[" in r.nodeid for r in ran)
        terminalreporter.write_line(
            f"wide kernels: {len(ran)} kernel cases executed ({len(ran) - gpu} on CPU through the Triton "
            f"interpreter, {gpu} on a GPU), {len(skipped)} skipped")
