"""A vLLM folder from anywhere: confined to itself, finite, refused in one line (wide_export/vllm/check.py,
guard.py, compat.py), and the writer's refusals of non-finite input. No engine starts here: `wide-export vllm`
and its `--check` in process, `wide-vllm serve` refusing before vLLM starts, vLLM's own config step
(EngineArgs.create_model_config, where the plugin's guard runs before vLLM opens the folder's other files)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from tests.helpers import assert_one_line_error, make_checkpoint
from tests.vllm.support import hf_cache

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]
GiB = 1 << 30


def _run(*args: str):
    from wide_export.cli import app

    return CliRunner().invoke(app, [*args])


def _wide_vllm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from wide_export.vllm.compat import main; main()", *args],
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from wide_export.model.demo_tokenizer import write_demo_tokenizer

    folder = make_checkpoint(tmp_path_factory.mktemp("untrusted") / "ckpt", arch="llama", num_heads=4,
                             num_kv_heads=2, head_dim=32, hidden_size=128, attn_groups=2, ffn_groups=12, lora=True,
                             seed=12)
    write_demo_tokenizer(folder)
    (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    return folder


@pytest.fixture(scope="module")
def folder(ckpt, tmp_path_factory):
    out = tmp_path_factory.mktemp("written") / "out"
    result = _run("vllm", "--model", str(ckpt), "--output", str(out))
    assert result.exit_code == 0, result.output
    return out


def _copy(folder: Path, where: Path) -> Path:
    shutil.copytree(folder, where)
    return where


def _private(tmp_path: Path, content: bytes) -> Path:
    """A 0600 file of another folder."""
    other = tmp_path / "other"
    other.mkdir(exist_ok=True)
    path = other / f"secret-{len(list(other.iterdir()))}"
    path.write_bytes(content)
    path.chmod(0o600)
    return path


def _check(folder: Path) -> str:
    return assert_one_line_error(_run("vllm", "--check", str(folder)))


# ---- confined to the folder -------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["model.safetensors", "tokenizer.json", "tokenizer_config.json",
                                  "generation_config.json", "chat_template.jinja"])
def test_a_file_linked_out_of_the_folder_is_refused(folder, tmp_path, name):
    bad = _copy(folder, tmp_path / "bad")
    target = Path("/etc/passwd") if name == "tokenizer.json" else _private(tmp_path, (folder / name).read_bytes()
                                                                          if (folder / name).exists() else b"{}")
    (bad / name).unlink(missing_ok=True)
    (bad / name).symlink_to(target)
    line = _check(bad)
    assert f"{bad / name} resolves to {target}, outside {bad}" in line


def test_serve_and_vllms_config_step_refuse_a_linked_folder_and_take_the_hugging_face_cache(folder, tmp_path):
    """`wide-vllm serve` refuses in one line before vLLM starts; vLLM's own config step (what `vllm serve` and
    vllm.LLM run first) refuses through the plugin's guard, before it opens the weights or the tokenizer. A
    Hugging Face cache snapshot, whose files link into the repository's blobs/, is accepted by both."""
    from vllm.engine.arg_utils import EngineArgs

    bad = _copy(folder, tmp_path / "bad")
    (bad / "model.safetensors").unlink()
    (bad / "model.safetensors").symlink_to(_private(tmp_path, (folder / "model.safetensors").read_bytes()))
    done = _wide_vllm("serve", str(bad), "--port", "1")
    line = assert_one_line_error(done)
    assert "model.safetensors resolves to" in line and "outside" in line
    with pytest.raises(Exception) as err:
        EngineArgs(model=str(bad)).create_model_config()
    assert "WIDE: the folder's file" in str(err.value) and "outside" in str(err.value)
    snapshot = hf_cache(folder, tmp_path / "hub")
    assert all((snapshot / f.name).is_symlink() for f in folder.iterdir())
    assert _run("vllm", "--check", str(snapshot)).exit_code == 0
    assert EngineArgs(model=str(snapshot)).create_model_config().architecture == "WideLlamaForCausalLM"
    nan = _copy(folder, tmp_path / "nan")  # through the same step: NaN router values in the folder
    weights = load_file(str(nan / "model.safetensors"))
    weights["model.layers.1.router_ffn.router.bias"][3] = float("nan")
    save_file(weights, str(nan / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(Exception) as err:
        EngineArgs(model=str(nan)).create_model_config()
    assert "WIDE: model.layers.1.router_ffn.router.bias " in str(err.value) and "1 non-finite" in str(err.value)


# ---- finite -----------------------------------------------------------------------------------------------------
def test_non_finite_router_pth_is_refused_by_the_writer(ckpt, tmp_path):
    state = torch.load(ckpt / "router.pth", weights_only=True)
    key = next(k for k in state if k.endswith("router_attention.compressor.weight"))
    state[key] = state[key].clone()
    state[key][0, 0] = float("inf")
    torch.save(state, tmp_path / "router.pth")
    out = tmp_path / "out"
    line = assert_one_line_error(_run("vllm", "--model", str(ckpt), "--router", str(tmp_path / "router.pth"),
                                      "--output", str(out)))
    assert "router_attention.compressor.weight holds 1 non-finite values" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["router.pth"]


@pytest.mark.parametrize("scale", ["nan", "inf", "-inf", "1e40"])
@pytest.mark.parametrize("command", ["vllm", "onnx"])
def test_a_non_finite_or_absurd_lora_scale_is_refused(ckpt, tmp_path, scale, command):
    out = tmp_path / "out"
    line = assert_one_line_error(_run(command, "--model", str(ckpt), "--lora", str(ckpt / "lora.pth"),
                                      "--lora-scale", scale, "--output", str(out)))
    assert "--lora-scale is" in line and "finite number between -1000 and 1000" in line
    assert not out.exists()


def test_merged_weights_that_overflow_are_refused(ckpt, tmp_path):
    lora = torch.load(ckpt / "lora.pth", weights_only=True)
    for key in [k for k in lora if "layers.0.self_attn.q_proj.lora_" in k]:  # each finite, B @ A is not
        lora[key] = torch.full_like(lora[key], 1e20)
    torch.save(lora, tmp_path / "lora.pth")
    out = tmp_path / "out"
    result = _run("vllm", "--model", str(ckpt), "--lora", str(tmp_path / "lora.pth"), "--output", str(out))
    assert result.exit_code == 2 and "Traceback" not in result.output
    line = result.stderr.strip().splitlines()[-1]  # found while the weights are written: after the load stage
    assert line.startswith("error: ") and "LoRA" in line and "model.layers.0.self_attn.q_proj.weight" in line, line
    assert "non-finite" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lora.pth"]


def _edit_config(folder: Path, tmp_path: Path, edit) -> Path:
    bad = _copy(folder, tmp_path / "edited")
    cfg = json.loads((bad / "config.json").read_text())
    edit(cfg)
    (bad / "config.json").write_text(json.dumps(cfg))
    return bad


def _set_rank(rank):
    def edit(cfg):
        cfg["wide"]["layers"][0]["ffn"]["rank"] = rank
    return edit


@pytest.mark.parametrize("edit,needle", [
    (lambda c: c["wide"].update(lora={"merged_pairs": 8, "scale": float("nan")}), "lora scale is nan"),
    (_set_rank(10**9), "layer 0 ffn rank is 1000000000, more than the hidden size 128"),
    (_set_rank(16.0), "layer 0 ffn rank is 16.0, not a positive integer"),
])
def test_a_config_the_plugin_cannot_build_is_refused(folder, tmp_path, edit, needle):
    assert needle in _check(_edit_config(folder, tmp_path, edit))


@pytest.mark.parametrize("change,needle", [
    (lambda t: t.half(), "router_ffn.router.bias is F16 in the folder; router tensors are float32"),
    (lambda t: t.to(torch.int32), "router_ffn.router.bias is I32 in the folder; router tensors are float32"),
    (lambda t: torch.full_like(t, float("nan")), "router_ffn.router.bias holds 24 non-finite values"),
])
def test_router_tensors_of_another_dtype_or_not_finite_are_refused(folder, tmp_path, change, needle):
    bad = _copy(folder, tmp_path / "bad")
    weights = load_file(str(bad / "model.safetensors"))
    name = "model.layers.0.router_ffn.router.bias"  # [2 x 12 groups]
    weights[name] = change(weights[name])
    save_file(weights, str(bad / "model.safetensors"), metadata={"format": "pt"})
    assert needle in _check(bad)


def test_the_plugins_loader_refuses_non_finite_and_non_float32_router_tensors():
    from wide_export.vllm.model import _Affine

    layer = _Affine(2, 3, "model.layers.0.router_ffn.router")
    with pytest.raises(ValueError, match="router.bias holds non-finite values"):
        layer._load(layer.bias, torch.tensor([0.0, float("inf")]))
    with pytest.raises(ValueError, match="router.weight is float16.*float32"):
        layer._load(layer.weight, torch.zeros(2, 3, dtype=torch.float16))
    layer._load(layer.bias, torch.tensor([1.0, 2.0]))
    assert layer.bias.tolist() == [1.0, 2.0]


# ---- refused in one line ----------------------------------------------------------------------------------------
def test_a_truncated_shard_is_named(folder, tmp_path):
    bad = _copy(folder, tmp_path / "bad")
    data = (bad / "model.safetensors").read_bytes()
    (bad / "model.safetensors").write_bytes(data[: len(data) - 1000])
    line = _check(bad)
    assert f"{bad / 'model.safetensors'} is truncated: tensor" in line
    done = _wide_vllm("serve", str(bad))
    assert "is truncated: tensor" in assert_one_line_error(done)


def test_the_loader_reports_a_damaged_shard_as_ours(folder, tmp_path):
    from safetensors import SafetensorError, safe_open

    from wide_export.vllm.model import _readable

    bad = tmp_path / "bad.safetensors"
    bad.write_bytes((folder / "model.safetensors").read_bytes()[:200])

    def stream():
        with safe_open(str(bad), framework="pt") as st:
            yield from ((k, st.get_tensor(k)) for k in st.keys())

    with pytest.raises(SafetensorError):
        list(stream())
    with pytest.raises(ValueError, match="^WIDE: .*safetensors"):
        list(_readable(stream()))


def test_check_accepts_the_written_folder(folder):
    result = _run("vllm", "--check", str(folder))
    assert result.exit_code == 0, result.output
    assert "router tensors, a tokenizer; every file lies inside the folder" in result.output


# ---- the writer -------------------------------------------------------------------------------------------------
def test_force_onto_a_symlink_is_refused_up_front(ckpt, tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (real / "keep").write_text("x")
    link = tmp_path / "link"
    link.symlink_to(real)
    line = assert_one_line_error(_run("vllm", "--model", str(ckpt), "--output", str(link), "--force"))
    assert "is a symbolic link" in line and str(real) in line
    assert link.is_symlink() and (real / "keep").read_text() == "x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "real"]


def test_a_source_without_a_tokenizer_is_written_with_a_warning(tmp_path):
    ckpt = make_checkpoint(tmp_path / "ckpt", num_heads=4, num_kv_heads=2, head_dim=32, hidden_size=128,
                           attn_groups=2, ffn_groups=12, seed=13)
    assert not (ckpt / "tokenizer.json").exists()
    out = tmp_path / "out"
    result = _run("vllm", "--model", str(ckpt), "--output", str(out))
    assert result.exit_code == 0, result.output
    assert "has no tokenizer" in result.output and "skip_tokenizer_init" in result.output
    done = _wide_vllm("serve", str(out))
    assert "has no tokenizer" in assert_one_line_error(done)


# ---- wide-vllm serve's defaults ---------------------------------------------------------------------------------
def test_serve_defaults_fit_the_machine_and_listen_on_loopback():
    from wide_export.vllm.compat import serve_defaults

    args, notes = serve_defaults(["serve", "OUT"], cpu=True, total=int(23.54 * GiB), available=int(21.27 * GiB),
                                 weights=GiB // 10, environ={})
    i = args.index("--kv-cache-memory-bytes")
    kv = int(args[i + 1])
    assert args[args.index("--host") + 1] == "127.0.0.1"
    assert 2 * GiB < kv < (21.27 * GiB - 2 * GiB) / 2  # fits what is free, beside the weights and the engine
    assert len(notes) == 2 and "127.0.0.1" in notes[0] and f"{kv / GiB:.2f} GiB" in notes[1]
    for given in (["--gpu-memory-utilization", "0.25"], ["--kv-cache-memory-bytes=1000000000"],
                  ["--host", "0.0.0.0"]):
        args, _ = serve_defaults(["serve", "OUT", *given], cpu=True, total=32 * GiB, available=30 * GiB, weights=0,
                                 environ={})
        assert args.count(given[0].split("=")[0]) + sum(a.startswith(given[0].split("=")[0] + "=") for a in args) == 1
    args, _ = serve_defaults(["serve", "OUT"], cpu=False, total=32 * GiB, available=30 * GiB, weights=0, environ={})
    assert "--kv-cache-memory-bytes" not in args  # on a GPU vLLM's fraction applies to the GPU's memory
    args, _ = serve_defaults(["serve", "OUT"], cpu=True, total=32 * GiB, available=30 * GiB, weights=0,
                             environ={"VLLM_CPU_KVCACHE_SPACE": "4"})
    assert "--kv-cache-memory-bytes" not in args


def test_the_plugin_fits_the_cpu_kv_cache_where_the_fraction_does_not(monkeypatch, capsys):
    """`vllm serve` / vllm.LLM on CPU: the default fraction (0.92 of the machine) fails when less is free; the
    plugin sizes the KV cache from what is free instead and says so. A fraction that fits is kept."""
    from wide_export.vllm import compat, guard

    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)

    def config(util):
        return types.SimpleNamespace(cache_config=types.SimpleNamespace(gpu_memory_utilization=util,
                                                                        kv_cache_memory_bytes=None),
                                     model_config=types.SimpleNamespace(model="org/not-a-folder"))

    monkeypatch.setattr(compat, "memory_now", lambda: (int(23.54 * GiB), int(21.27 * GiB)))
    tight = config(0.92)
    guard.fit_cpu_kv_cache(tight)
    assert 2 * GiB < tight.cache_config.kv_cache_memory_bytes < 10 * GiB
    assert "KV cache set to" in capsys.readouterr().err
    loose = config(0.25)
    guard.fit_cpu_kv_cache(loose)
    assert loose.cache_config.kv_cache_memory_bytes is None
