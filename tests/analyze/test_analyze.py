"""`wide-export analyze` on a tiny checkpoint with a tokenizer trained offline.

The oracle is independent of wide_export: the text is tokenized with the
`tokenizers` library directly and cut into windows here, the base model runs in
transformers, and the routers are applied by hand to the hidden states that
forward pre-hooks see (tests/model/hf_routing.py); sparsity and perplexity are
counted from those masks and logits with numpy/torch here.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from tests.helpers import assert_one_line_error, make_checkpoint
from tests.model.hf_routing import load_routed_hf
from wide_export.analyze import analyze_text

WINDOW = 25
TEXT = " ".join(
    f"{w} number {i % 7} goes over the {c} fence while the {c} dog sleeps."
    for i, (w, c) in enumerate(zip(["one", "two", "three", "four", "five", "six"] * 4,
                                   ["red", "green", "blue", "white"] * 6)))


def _tokenizer(text: str):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator([text], trainers.BpeTrainer(vocab_size=120, special_tokens=["<unk>", "<s>"],
                                                         show_progress=False))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])  # BOS
    return tok


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    root = tmp_path_factory.mktemp("analyze")
    folder = make_checkpoint(root / "model", arch="llama", num_layers=2, seed=11)
    _tokenizer(TEXT).save(str(folder / "tokenizer.json"))
    text = root / "text.txt"
    text.write_text(TEXT)
    return folder, text


def _cli(*args):
    import tempfile

    from wide_export.cli import app

    if "--output" not in args:  # never the default folder in the working tree, even when a check is broken
        args = (*args, "--output", tempfile.mkdtemp(prefix="analyze-"))
    return CliRunner().invoke(app, ["analyze", *map(str, args)])


def test_analyze_prints_the_table_and_writes_the_plot(ckpt, tmp_path):
    folder, text = ckpt
    res = _cli("--model", folder, "--text", text, "--window", WINDOW, "--output", tmp_path)
    assert res.exit_code == 0, res.output
    assert "realized sparsity per layer" in res.output and "perplexity: dense" in res.output
    assert (tmp_path / "analyze.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads((tmp_path / "analyze.json").read_text())
    assert [r["layer"] for r in data["layers"]] == [0, 1]
    assert all(0 < r[k]["mean"] < 1 for r in data["layers"] for k in ("attention", "ffn"))


def _hand_counts(folder, text_path):
    """Per (layer, kind): per-token skipped fraction; and (ppl dense, ppl WIDE), all from transformers + hooks."""
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(str(folder / "tokenizer.json")).encode(text_path.read_text()).ids
    assert ids[0] == 1  # the BOS the post-processor adds
    chunks = [ids[i:i + WINDOW] for i in range(0, len(ids), WINDOW)]
    chunks = [c for c in chunks if len(c) >= 2]
    assert len(chunks) >= 3 and len(chunks[-1]) < WINDOW  # several windows, a short last one
    routed = load_routed_hf(folder)
    skipped: dict = {}
    nll = {"wide": 0.0, "dense": 0.0}
    n = 0
    for chunk in chunks:
        x = torch.tensor([chunk])
        logits = routed(input_ids=x).logits[0].double()
        nll["wide"] += torch.nn.functional.cross_entropy(logits[:-1], x[0, 1:], reduction="sum").item()
        n += len(chunk) - 1
        for key, mask in routed.masks.items():
            skipped.setdefault(key, []).append(1.0 - mask[0].double().mean(-1).numpy())
    routed.remove()  # the plain base model: every group executes
    with torch.no_grad():
        for chunk in chunks:
            x = torch.tensor([chunk])
            logits = routed.model(input_ids=x).logits[0].double()
            nll["dense"] += torch.nn.functional.cross_entropy(logits[:-1], x[0, 1:], reduction="sum").item()
    return ({k: np.concatenate(v) for k, v in skipped.items()}, math.exp(nll["dense"] / n),
            math.exp(nll["wide"] / n), sum(map(len, chunks)))


@pytest.fixture(scope="module")
def hand(ckpt):
    return _hand_counts(*ckpt)


def test_sparsity_and_perplexity_match_an_independent_count(ckpt, hand):
    folder, text = ckpt
    report = analyze_text(folder, text, window=WINDOW)
    skipped, ppl_dense, ppl_wide, tokens = hand
    assert report.tokens == tokens
    for row in report.layers:
        for kind in ("attention", "ffn"):
            got, want = getattr(row, kind), skipped[row.layer, kind]
            assert got.mean == pytest.approx(want.mean(), abs=1e-9), (row.layer, kind)
            assert got.std == pytest.approx(want.std(), abs=1e-9), (row.layer, kind)
            assert got.p10 == pytest.approx(np.quantile(want, 0.1), abs=1e-9)
            assert got.p90 == pytest.approx(np.quantile(want, 0.9), abs=1e-9)
            assert 0 < got.std  # the decisions do vary across tokens
    assert report.ppl_dense == pytest.approx(ppl_dense, rel=1e-4)
    assert report.ppl_wide == pytest.approx(ppl_wide, rel=1e-4)
    assert abs(report.ppl_wide - report.ppl_dense) > 1e-3  # routing changed the model


def _bench_row(kernel, gs, tokens, sparsity, speedup, mask="random", N=64, K=64):
    return {"kernel": kernel, "shape": "x", "N": N, "K": K, "group_size": gs, "sparsity": sparsity, "mask": mask,
            "tokens": tokens, "speedup": speedup}


def test_predicted_speedup_follows_the_kernel_benchmark(ckpt, tmp_path):
    """Speed-ups chosen here, the FLOP-weighted harmonic combination recomputed by hand."""
    folder, text = ckpt
    table = {"n": (1.2, 2.0), "gated": (1.4, 3.0), "k": (1.1, 1.5)}  # speed-up at sparsity 0.25 and 0.75
    rows = []
    for kernel, (lo, hi) in table.items():
        for tokens in (1, WINDOW):
            bonus = 0.5 if tokens == 1 else 0.0  # decode rows differ from prefill rows
            rows += [_bench_row(kernel, 16, tokens, 0.25, lo + bonus), _bench_row(kernel, 16, tokens, 0.75, hi + bonus),
                     _bench_row(kernel, 512, tokens, 0.5, 99.0),                    # another group size
                     _bench_row(kernel, 16, tokens, 0.5, 99.0, mask="correlated")]  # another mask kind
        rows.append(_bench_row(kernel, 16, 4096, 0.5, 99.0))                       # another token count
    bench = tmp_path / "kernels.json"
    bench.write_text(json.dumps({"rows": rows}))
    report = analyze_text(folder, text, window=WINDOW, kernels_json=bench)

    # the checkpoint: hidden 64, 8 heads of 8, 2 kv heads, intermediate 192, groups of 2 heads / 16 channels
    H, Q, KV, I = 64, 64, 2 * 2 * 8, 192

    def at(kernel, s, bonus):
        lo, hi = table[kernel]
        s = min(max(s, 0.25), 0.75)
        return lo + bonus + (hi - lo) * (s - 0.25) / 0.5

    for phase, bonus in (("prefill", 0.0), ("decode", 0.5)):
        total_w = total_t = 0.0
        for row in report.layers:
            a, f = row.attention.mean, row.ffn.mean
            terms = [(KV * H, 1.0), (Q * H, at("n", a, bonus)), (H * Q, at("k", a, bonus)),
                     (2 * I * H, at("gated", f, bonus)), (H * I, at("k", f, bonus))]
            w, t = sum(w for w, _ in terms), sum(w / s for w, s in terms)
            assert row.predicted[phase] == pytest.approx(w / t, rel=1e-9), (phase, row.layer)
            total_w, total_t = total_w + w, total_t + t
        assert report.predicted_total[phase] == pytest.approx(total_w / total_t, rel=1e-9)
    res = _cli("--model", folder, "--text", text, "--window", WINDOW, "--kernels-json", bench,
               "--output", tmp_path / "o")
    assert res.exit_code == 0, res.output
    assert "pred. prefill" in res.output and "total" in res.output


def test_a_folder_without_tokenizer_is_one_clear_error(ckpt, tmp_path):
    _, text = ckpt
    bare = make_checkpoint(tmp_path / "bare", arch="llama", num_layers=1)
    line = assert_one_line_error(_cli("--model", bare, "--text", text))
    assert "no tokenizer" in line and "tokenizer.json" in line


def test_an_empty_text_is_one_clear_error(ckpt, tmp_path):
    folder, _ = ckpt
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n\n")
    line = assert_one_line_error(_cli("--model", folder, "--text", empty))
    assert "is empty" in line


def test_a_window_longer_than_the_model_allows_is_one_clear_error(ckpt):
    folder, text = ckpt  # SyntheticSpec: max_position_embeddings = 512
    line = assert_one_line_error(_cli("--model", folder, "--text", text, "--window", 513))
    assert "longer than the model allows" in line and "512" in line


def test_a_file_that_is_not_a_kernel_benchmark_is_one_clear_error(ckpt, tmp_path):
    folder, text = ckpt
    bad = tmp_path / "k.json"
    bad.write_text(json.dumps({"rows": [{"kernel": "n"}]}))
    line = assert_one_line_error(_cli("--model", folder, "--text", text, "--kernels-json", bad))
    assert "kernel benchmark" in line


@pytest.fixture(scope="module")
def export(ckpt, tmp_path_factory):
    """The checkpoint exported by the real `wide-export onnx` command (float32, no verification)."""
    import subprocess
    import sys

    out = tmp_path_factory.mktemp("onnx") / "export"
    done = subprocess.run([sys.executable, "-m", "wide_export", "onnx", "--model", str(ckpt[0]), "--output", str(out),
                           "--no-verify"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def test_onnx_export_perplexity_and_router_agreement(ckpt, hand, export, tmp_path):
    folder, text = ckpt
    report = analyze_text(folder, text, window=WINDOW, onnx_dir=export)
    assert report.onnx["ppl"] == pytest.approx(hand[2], rel=1e-4)  # the routed transformers model's perplexity
    assert set(report.onnx["agreement"]) == {f"{i}.{k}" for i in (0, 1) for k in ("attention", "ffn")}
    assert all(a == 1.0 for a in report.onnx["agreement"].values()), report.onnx
    res = _cli("--model", folder, "--text", text, "--window", WINDOW, "--onnx", export, "--output", tmp_path)
    assert res.exit_code == 0, res.output
    assert "ONNX export (float32, onnxruntime)" in res.output and "router agreement 100.00%" in res.output


def test_onnx_router_agreement_counts_disagreements(ckpt, export):
    """Reference masks inverted by hand: every decision disagrees."""
    from tokenizers import Tokenizer

    from wide_export.analyze.onnx_eval import onnx_windows
    from wide_export.export.onnx_export import read_wide_config
    from wide_export.export.session import debug_session

    folder, text = ckpt
    ids = Tokenizer.from_file(str(folder / "tokenizer.json")).encode(text.read_text()).ids[:WINDOW]
    config = read_wide_config(export)
    session = debug_session(export, config)
    routed = load_routed_hf(folder)
    routed(input_ids=torch.tensor([ids]))
    inverted = {key: (~m).to(torch.int32).numpy() for key, m in routed.masks.items()}
    out = onnx_windows(session, config, [ids], [inverted])
    assert all(a == 0.0 for a in out["agreement"].values()), out
    half = {key: m if key[1] == "ffn" else (1 - m) for key, m in
            ((k, v.to(torch.int32).numpy()) for k, v in routed.masks.items())}
    out = onnx_windows(session, config, [ids], [half])
    assert {k: a for k, a in out["agreement"].items()} == {"0.attention": 0.0, "0.ffn": 1.0, "1.attention": 0.0,
                                                           "1.ffn": 1.0}


def test_an_export_of_another_model_is_one_clear_error(ckpt, export, tmp_path):
    folder, text = ckpt
    other = tmp_path / "other"
    other.mkdir()
    config = json.loads((export / "wide_config.json").read_text())
    (other / "wide_config.json").write_text(json.dumps({**config, "num_layers": 3}))
    (other / "model.onnx").write_bytes(b"")
    line = assert_one_line_error(_cli("--model", folder, "--text", text, "--onnx", other))
    assert "num_layers=3" in line and "export of this --model" in line


def test_cpu_interpreter_timings_are_refused_before_the_model_loads(ckpt, tmp_path):
    """A kernels.json from `bench kernels` on CPU (Triton interpreter) predicts 0.01x-style nonsense: refused."""
    folder, text = ckpt
    bench = tmp_path / "kernels.json"
    bench.write_text(json.dumps({"device": "cpu (Triton interpreter)", "arch": "interpreter",
                                 "rows": [_bench_row("n", 16, 1, 0.5, 0.01)]}))
    line = assert_one_line_error(_cli("--model", folder, "--text", text, "--kernels-json", bench))
    assert "CPU timings" in line and "Triton interpreter" in line and "no speed-up is predicted" in line


def test_progress_names_the_window_and_the_layer(ckpt):
    folder, text = ckpt
    said: list[str] = []
    report = analyze_text(folder, text, window=WINDOW, progress=said.append)
    for n in range(1, report.windows + 1):
        for side in ("WIDE", "dense"):
            head = f"window {n}/{report.windows} ("
            assert any(m.startswith(head) and m.endswith(f", {side}, layer 2/2") for m in said), (n, side, said)


def test_piped_progress_is_one_line_per_window(ckpt, tmp_path, monkeypatch):
    monkeypatch.setenv("WIDE_PROGRESS_DELAY", "0")  # every stage, however quick
    folder, text = ckpt
    res = _cli("--model", folder, "--text", text, "--window", WINDOW, "--output", tmp_path / "o")
    assert res.exit_code == 0, res.output
    windows = json.loads((tmp_path / "o" / "analyze.json").read_text())["windows"]
    lines = [ln for ln in res.output.splitlines() if ln.startswith("analyze: window ")]
    assert len(lines) == windows and lines[0].startswith(f"analyze: window 1/{windows} (")


def test_the_plot_legend_leaves_the_predicted_lines_visible(ckpt, tmp_path, monkeypatch):
    import matplotlib.figure

    from wide_export.analyze.report import write_plot

    folder, text = ckpt
    rows = [_bench_row(k, 16, t, s, 1.5) for k in ("n", "gated", "k") for t in (1, WINDOW) for s in (0.25, 0.75)]
    bench = tmp_path / "kernels.json"
    bench.write_text(json.dumps({"rows": rows}))
    report = analyze_text(folder, text, window=WINDOW, kernels_json=bench)
    saved = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda fig, *a, **k: saved.append(fig))
    write_plot(report, tmp_path / "analyze.png")
    fig = saved[0]
    fig.canvas.draw()
    legends = fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    assert len(legends) == 1
    labels = [t.get_text() for t in legends[0].get_texts()]
    assert "predicted decode speed-up" in labels and "predicted prefill speed-up" in labels
    box = legends[0].get_window_extent()
    for ax in fig.axes:  # the legend covers no data area (nor the x label)
        assert not box.overlaps(ax.get_window_extent()), (box, ax.get_window_extent())
        assert not box.overlaps(ax.xaxis.label.get_window_extent())
