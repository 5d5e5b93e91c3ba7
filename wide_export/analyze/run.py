"""Run the PyTorch reference over a text in windows: realized sparsity per layer, perplexity dense vs WIDE."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from wide_export.base.errors import WideError

KINDS = ("attention", "ffn")


@dataclass
class SparsityStats:
    """Fraction of a sublayer's groups skipped per token: mean and spread over the text's tokens."""

    groups: int
    group_size: int           # query heads (attention) or channels (ffn) per group
    mean: float
    std: float
    p10: float
    p90: float


@dataclass
class LayerStats:
    layer: int
    attention: Optional[SparsityStats] = None  # None: this sublayer has no router (dense)
    ffn: Optional[SparsityStats] = None
    predicted: dict = field(default_factory=dict)  # "prefill"/"decode" -> speed-up (with --kernels-json)


@dataclass
class AnalysisReport:
    model: str
    text: str
    tokens: int
    window: int
    windows: int
    ppl_dense: float
    ppl_wide: float
    layers: list[LayerStats] = field(default_factory=list)
    predicted_total: dict = field(default_factory=dict)
    prediction_basis: str = ""
    onnx: dict = field(default_factory=dict)  # with --onnx: ppl, dtype, per-router decision agreement
    group_rates: dict = field(default_factory=dict)  # "layer.kind" -> fraction of tokens executing each group
    tp: dict = field(default_factory=dict)  # with --tp: predicted per-rank loads (wide_export/tp/balance.py)


def _stats(per_token, groups: int, group_size: int) -> SparsityStats:
    import torch

    s = per_token.double()
    q = torch.quantile(s, torch.tensor([0.1, 0.9], dtype=torch.float64))
    return SparsityStats(groups, group_size, s.mean().item(), s.std(unbiased=False).item(), q[0].item(), q[1].item())


def _nll(logits, ids) -> tuple[float, int]:
    """Summed next-token negative log-likelihood over one window, and how many tokens it predicted."""
    import torch.nn.functional as F

    return F.cross_entropy(logits[0, :-1].double(), ids[0, 1:], reduction="sum").item(), ids.shape[1] - 1


def analyze_text(model_dir: Path, text_path: Path, *, router: Optional[Path] = None, lora: Optional[Path] = None,
                 lora_scale: float = 2.0, window: int = 512, kernels_json: Optional[Path] = None,
                 onnx_dir: Optional[Path] = None, progress: Optional[Callable[[str], None]] = None,
                 tp: Optional[int] = None) -> AnalysisReport:
    """Realized sparsity per layer and perplexity dense vs WIDE of `model_dir` on the text of `text_path`."""
    import torch

    from wide_export.checkpoint.text import load_tokenizer, read_text, windows
    from wide_export.checkpoint import load_wide_model

    say = progress or (lambda _m: None)
    if window < 2:
        raise WideError(f"--window {window} is too short", "a window needs at least 2 tokens to predict one")
    text = read_text(text_path)  # before loading the model: cheap errors first
    if kernels_json is not None:
        from wide_export.analyze.predict import load_rows

        rows = load_rows(kernels_json)
    encode = load_tokenizer(model_dir)
    if tp is not None and tp < 1:
        raise WideError(f"--tp {tp} is not a world size", "pass --tp N with N >= 1")
    loaded = load_wide_model(model_dir, router=router, lora=lora, lora_scale=lora_scale, progress=say,
                             checksums=False)
    model, cfg = loaded.model, loaded.config
    if tp is not None:
        from wide_export.tp.plan import check_tp

        check_tp(cfg, tp)
    if window > cfg.max_position_embeddings:
        raise WideError(f"--window {window} is longer than the model allows "
                        f"(max_position_embeddings = {cfg.max_position_embeddings})",
                        f"pass --window {cfg.max_position_embeddings} or less")
    ids = encode(text)
    chunks = windows(ids, window)
    if not chunks:
        raise WideError(f"{text_path} gives {len(ids)} token(s), too few to measure anything",
                        "pass a longer text (at least 2 tokens)")
    if max(ids) >= cfg.vocab_size:
        raise WideError(f"the tokenizer produced id {max(ids)}, the model's vocabulary has {cfg.vocab_size} entries",
                        "the folder's tokenizer does not belong to this model")

    session = None
    if onnx_dir is not None:
        from wide_export.analyze.onnx_eval import open_export

        say("opening the ONNX export")
        session, onnx_config = open_export(onnx_dir, cfg)
    per_token: dict[tuple[int, str], list] = {}
    group_runs: dict[tuple[int, str], object] = {}
    window_masks: list[dict] = []  # per window {(layer, kind): mask numpy}, for --onnx
    nll = {"wide": 0.0, "dense": 0.0}
    counted = [0]
    # Progress inside a window too: a 32k-token window is minutes of one forward pass per side.
    where = {"text": ""}
    layers = model.model.layers
    hooks = [layer.register_forward_hook(lambda _m, _i, _o, i=i: say(f"{where['text']}, layer {i + 1}/"
                                                                      f"{len(layers)}"))
             for i, layer in enumerate(layers)]
    try:
        _run_windows(model, chunks, where, say, per_token, group_runs, window_masks, nll, session is not None,
                     counted)
    finally:
        for hook in hooks:
            hook.remove()
    count = counted[0]
    model.set_force_execute(False)

    report = AnalysisReport(model=str(model_dir), text=str(text_path), tokens=sum(map(len, chunks)), window=window,
                            windows=len(chunks), ppl_dense=math.exp(nll["dense"] / count),
                            ppl_wide=math.exp(nll["wide"] / count))
    for i in range(cfg.num_layers):
        row = LayerStats(i)
        r = cfg.routing[i]
        if (i, "attention") in per_token:
            row.attention = _stats(torch.cat(per_token[i, "attention"]), r.attn_groups, cfg.attn_group_size(i))
        if (i, "ffn") in per_token:
            row.ffn = _stats(torch.cat(per_token[i, "ffn"]), r.ffn_groups, cfg.ffn_group_size(i))
        report.layers.append(row)
    tokens = sum(map(len, chunks))
    report.group_rates = {f"{i}.{kind}": (v / tokens).tolist() for (i, kind), v in sorted(group_runs.items())}
    if tp is not None:
        from wide_export.tp.balance import from_rates

        rates = {(i, kind): v for (i, kind), v in ((tuple(k.split(".")), v) for k, v in report.group_rates.items())}
        rates = {(int(i), kind): v for (i, kind), v in rates.items()}
        report.tp = from_rates(rates, cfg, tp, tokens, str(text_path)).to_dict()
    if session is not None:
        from wide_export.analyze.onnx_eval import onnx_windows

        report.onnx = onnx_windows(session, onnx_config, chunks, window_masks, say)
    if kernels_json is not None:
        from wide_export.analyze.predict import predict

        predict(report, cfg, rows, Path(kernels_json).name)
    return report


def _run_windows(model, chunks, where, say, per_token, group_runs, window_masks, nll, keep_masks: bool,
                 counted) -> None:
    """Each window through the model twice (routed, then routers forced on), accumulating the statistics."""
    import torch

    from wide_export.model.modeling import Collector

    with torch.no_grad():
        for n, chunk in enumerate(chunks):
            where["text"] = f"window {n + 1}/{len(chunks)} ({len(chunk)} tokens), WIDE"
            say(where["text"])
            x = torch.tensor([chunk], dtype=torch.long)
            args = (x, torch.ones_like(x), torch.arange(x.shape[1])[None], model.empty_cache(1))
            collect = Collector()
            model.set_force_execute(False)
            logits, _ = model(*args, collect=collect)
            nw, c = _nll(logits, x)
            nll["wide"] += nw
            counted[0] += c
            for i, masks in enumerate(collect.masks):
                for kind, m in masks.items():  # [1, T, G] int32, 1 = execute
                    per_token.setdefault((i, kind), []).append(1.0 - m[0].double().mean(-1))
                    runs = m[0].double().sum(0)  # per group: tokens that execute it
                    group_runs[i, kind] = runs if (i, kind) not in group_runs else group_runs[i, kind] + runs
            if keep_masks:
                window_masks.append({(i, kind): m.numpy() for i, masks in enumerate(collect.masks)
                                     for kind, m in masks.items()})
            model.set_force_execute(True)
            where["text"] = where["text"].replace(", WIDE", ", dense")
            logits, _ = model(*args)
            nll["dense"] += _nll(logits, x)[0]
