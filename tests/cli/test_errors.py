"""The error catalogue: one clear line, exit 2, no traceback, nothing written, inputs untouched.

The wording is the contract here, in one test per message family: test_the_error_line_is_the_contract (the
line's own format, `error: <what> (hint: <how>)` or `error: <what>`, through cli.common.user_errors),
test_an_option_checked_while_parsing_is_the_whole_line (an error found while the command line is parsed) and
test_a_command_error_is_the_whole_line (an error the command body raises). Every other test here and elsewhere
asserts the error type, the exit code and the facts its line names (the path, the value, the option), so that a
reworded hint breaks only these."""

from __future__ import annotations

import hashlib
import json
import pickle
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tests.helpers import assert_one_line_error, make_checkpoint
from wide_export.cli import get_app
from wide_export.model.synthetic import SyntheticSpec, random_router_state

runner = CliRunner()


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("ckpt"), arch="llama", num_layers=2)


def tree_digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def run_fails(args: list[str], *expect: str, out: Path | None = None) -> str:
    result = runner.invoke(get_app(), args)
    line = assert_one_line_error(result)
    for piece in expect:
        assert piece in line, line
    if out is not None:
        assert not out.exists(), "nothing may be written on error"
        assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")], "temp left behind"
    return line


def write_router(path: Path, spec: SyntheticSpec, mutate=None) -> Path:
    state = random_router_state(spec, prefix="module.")
    if mutate:
        mutate(state)
    torch.save(state, path)
    return path


def test_router_from_a_model_with_more_layers(ckpt, tmp_path):
    bad = write_router(tmp_path / "r.pth", SyntheticSpec(num_layers=4))
    before = tree_digest(ckpt)
    run_fails(["onnx", "--model", str(ckpt), "--router", str(bad), "-o", str(tmp_path / "o")],
              "layer 2", "only 2 layers", out=tmp_path / "o")
    assert tree_digest(ckpt) == before


def test_router_with_another_hidden_size(ckpt, tmp_path):
    bad = write_router(tmp_path / "r.pth", SyntheticSpec(num_layers=2, hidden_size=32))
    run_fails(["onnx", "--model", str(ckpt), "--router", str(bad), "-o", str(tmp_path / "o")],
              "hidden size", out=tmp_path / "o")


def test_attention_groups_not_dividing_heads(ckpt, tmp_path):
    bad = write_router(tmp_path / "r.pth", SyntheticSpec(num_layers=2, attn_groups=3))
    run_fails(["onnx", "--model", str(ckpt), "--router", str(bad), "-o", str(tmp_path / "o")],
              "3 groups do not divide the 8 attention heads", out=tmp_path / "o")


def test_ffn_groups_not_dividing_channels(ckpt, tmp_path):
    bad = write_router(tmp_path / "r.pth", SyntheticSpec(num_layers=2, ffn_groups=5))
    run_fails(["onnx", "--model", str(ckpt), "--router", str(bad), "-o", str(tmp_path / "o")],
              "5 groups do not divide the 192 FFN channels", out=tmp_path / "o")


def test_router_missing_a_tensor(ckpt, tmp_path):
    bad = write_router(tmp_path / "r.pth", SyntheticSpec(num_layers=2),
                       lambda s: s.pop("module.model.layers.1.router_ffn.router.bias"))
    run_fails(["onnx", "--model", str(ckpt), "--router", str(bad), "-o", str(tmp_path / "o")],
              "missing router.bias", out=tmp_path / "o")


def test_corrupt_router_file(ckpt, tmp_path):
    good = (ckpt / "router.pth").read_bytes()
    bad = tmp_path / "r.pth"
    bad.write_bytes(good[: len(good) // 2])
    run_fails(["onnx", "--model", str(ckpt), "--router", str(bad), "-o", str(tmp_path / "o")],
              "not a torch.save file", out=tmp_path / "o")


def test_non_pickle_router_file(ckpt, tmp_path):
    bad = tmp_path / "r.pth"
    bad.write_text("this is not a pickle\n")
    run_fails(["onnx", "--model", str(ckpt), "--router", str(bad), "-o", str(tmp_path / "o")],
              "not a torch.save file", out=tmp_path / "o")


def test_router_pickle_with_code_is_refused(ckpt, tmp_path):
    bad = tmp_path / "r.pth"
    torch.save({"model.layers.0.router_ffn.compressor.weight": torch.zeros(2), "x": object()}, bad)
    run_fails(["onnx", "--model", str(ckpt), "--router", str(bad), "-o", str(tmp_path / "o")],
              "not a torch.save file of tensors", out=tmp_path / "o")


def test_missing_model_folder(tmp_path):
    run_fails(["onnx", "--model", str(tmp_path / "nope"), "-o", str(tmp_path / "o")],
              "model folder not found", out=tmp_path / "o")


def test_empty_model_folder(tmp_path):
    (tmp_path / "empty").mkdir()
    run_fails(["onnx", "--model", str(tmp_path / "empty"), "-o", str(tmp_path / "o")],
              "has no config.json", out=tmp_path / "o")


def test_model_folder_without_weights(ckpt, tmp_path):
    folder = tmp_path / "noweights"
    folder.mkdir()
    (folder / "config.json").write_text((ckpt / "config.json").read_text())
    (folder / "router.pth").write_bytes((ckpt / "router.pth").read_bytes())
    run_fails(["onnx", "--model", str(folder), "-o", str(tmp_path / "o")], "no *.safetensors", out=tmp_path / "o")


def test_missing_router_file(ckpt, tmp_path):
    run_fails(["onnx", "--model", str(ckpt), "--router", str(tmp_path / "none.pth"), "-o", str(tmp_path / "o")],
              "no router file", out=tmp_path / "o")


@pytest.mark.parametrize("change,expect", [
    ({"model_type": "gpt2"}, "unsupported architecture model_type='gpt2'"),
    ({"hidden_act": "gelu"}, "hidden_act='gelu' is not supported"),
])
def test_unsupported_architecture_or_activation(ckpt, tmp_path, change, expect):
    folder = tmp_path / "m"
    folder.mkdir()
    for f in ckpt.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(change)
    (folder / "config.json").write_text(json.dumps(cfg))
    run_fails(["onnx", "--model", str(folder), "-o", str(tmp_path / "o")], expect, out=tmp_path / "o")


def test_group_size_flag_disagreeing_with_router_file(ckpt, tmp_path):
    run_fails(["onnx", "--model", str(ckpt), "--attn-group-size", "4", "-o", str(tmp_path / "o")],
              "--attn-group-size=4 ", "router file", " 2 (hint: ", out=tmp_path / "o")


def test_existing_output_is_refused_and_kept(tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    run_fails(["onnx", "-o", str(out)], "already exists", "--force")
    assert (out / "keep.txt").read_text() == "mine"


def test_output_over_the_model_folder_is_refused_even_with_force(ckpt):
    before = tree_digest(ckpt)
    run_fails(["onnx", "--model", str(ckpt), "-o", str(ckpt), "--force"], "would replace your input")
    run_fails(["onnx", "--model", str(ckpt), "-o", str(ckpt.parent), "--force"], "would replace your input")
    assert tree_digest(ckpt) == before


def test_unwritable_output(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a file, not a folder")
    run_fails(["onnx", "-o", str(blocker / "o")], "cannot write to")


def test_bad_dtype(tmp_path):
    run_fails(["onnx", "-o", str(tmp_path / "o"), "--dtype", "int8"], "unsupported --dtype", out=tmp_path / "o")


def test_interrupt_leaves_nothing(tmp_path, monkeypatch):
    from wide_export.export import onnx_export

    def boom(*_a, **_k):
        raise KeyboardInterrupt

    monkeypatch.setattr(onnx_export, "_save", boom)
    result = runner.invoke(get_app(), ["onnx", "-o", str(tmp_path / "o"), "--no-verify"])
    assert result.exit_code == 130
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("make", [lambda p: p / "nope", lambda p: (p / "empty").mkdir() or p / "empty"],
                         ids=["missing", "empty"])
def test_verify_of_a_folder_that_is_not_an_export(tmp_path, make):
    run_fails(["verify", "--onnx", str(make(tmp_path))], "is not a wide-export ONNX folder")


@pytest.mark.parametrize("content", [bytes(range(256)) * 4,
                                     pickle.dumps({"x": {1, 2}}, protocol=4)], ids=["random", "pickle-of-a-set"])
def test_a_router_file_torch_refuses_gets_a_whole_reason(ckpt, tmp_path, content):
    """torch's weights-only message is a paragraph about its defaults: the line says why in whole words
    (it used to stop at '... Re-running `torch.'), and torch's pickle-protocol warning is no second line."""
    bad = tmp_path / "rand.pth"
    bad.write_bytes(content)
    line = run_fails(["onnx", "--model", str(ckpt), "--router", str(bad), "-o", str(tmp_path / "o")],
                     "not a torch.save file of tensors", "weights_only=True", "Unsupported operand", out=tmp_path / "o")
    assert "In PyTorch 2.6" not in line and "Re-running" not in line
    said, hint = line.split(" (hint: ")
    assert said.endswith(")") and "router .pth" in hint, line  # torch's reason whole, then our hint


def test_load_failure_cuts_other_messages_at_a_word():
    from wide_export.checkpoint.torchfile import load_failure

    said = load_failure(ValueError("word " * 100))
    assert said.endswith("word ...") and len(said) <= 165
    assert load_failure(ValueError("short reason\nmore")) == "short reason"


# -- the wording is the contract (module docstring): one test per message family
def test_the_error_line_is_the_contract():
    """cli.common.user_errors: a WideError is stderr `error: <message> (hint: <hint>)` and a newline, or
    `error: <message>` without a hint; nothing on stdout, exit 2. Brackets are text, not rich markup."""
    import typer

    from wide_export.base.errors import WideError
    from wide_export.cli.common import user_errors

    def command(error: WideError):
        @user_errors
        def work() -> None:
            raise error

        app = typer.Typer()
        app.command()(work)
        return app

    for error, line in [(WideError("what is wrong [bold]here[/]", hint="how to fix it"),
                         "error: what is wrong [bold]here[/] (hint: how to fix it)\n"),
                        (WideError("what is wrong"), "error: what is wrong\n")]:
        result = runner.invoke(command(error), [])
        assert (result.exit_code, result.stderr, result.stdout) == (2, line, ""), result.output


def test_an_option_checked_while_parsing_is_the_whole_line(tmp_path):
    """--model's check (cli.common's option callback, before the command body runs): the whole line."""
    result = runner.invoke(get_app(), ["onnx", "--model", str(tmp_path / "nope"), "-o", str(tmp_path / "o")])
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == (f"error: model folder not found: {tmp_path / 'nope'} "
                             "(hint: pass --model DIR, a Hugging Face model folder)\n")


def test_a_command_error_is_the_whole_line(tmp_path):
    """A WideError raised by the command body (the export's own checks): the whole line."""
    result = runner.invoke(get_app(), ["onnx", "-o", str(tmp_path / "o"), "--dtype", "int8"])
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == "error: unsupported --dtype int8 (hint: choose one of float32, float16, bfloat16)\n"
    assert not (tmp_path / "o").exists()
