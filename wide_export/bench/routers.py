"""Random routers at a stated sparsity, for benchmarks on synthetic checkpoints.

A synthetic checkpoint's routers (model/synthetic.py) skip about half the groups, and how many depends on
the weights. `calibrate` shifts each group's execute logit (router.bias[2 g]) so that on random tokens every
group is skipped by a fraction `sparsity` of them: the decisions stay per token (a batch's masks differ, as a
trained router's do), only the rate is set. Routers are calibrated in the order they run, each on the stream
the routers before it (already calibrated) produce. `measure` reports the skipped fraction on other tokens.
"""

from __future__ import annotations

from pathlib import Path

ALWAYS = 1e4  # added to the execute logit for sparsity 0: every group executes whatever the stream


SEQUENCES = 8  # a stream carries a part particular to its sequence: the rate is set over several


def _random_ids(vocab: int, tokens: int, seed: int):
    import torch

    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (SEQUENCES, max(1, tokens // SEQUENCES)), generator=gen)


def _margins(model, ids):
    """Per layer, {kind: margin [B * T, G]} of the reference's routers on `ids` [B, T]."""
    import torch

    from wide_export.model.modeling import Collector

    collect = Collector()
    b, t = ids.shape
    with torch.no_grad():
        model(ids, torch.ones_like(ids), torch.arange(t)[None].expand(b, t), model.empty_cache(b), collect=collect)
    return [{k: v.flatten(0, 1) for k, v in m.items()} for m in collect.margins]


def _router(model, layer: int, kind: str):
    return getattr(model.model.layers[layer], f"router_{kind}")


def calibrate(ckpt: Path, sparsity: float, *, tokens: int = 512, seed: int = 0) -> dict[str, float]:
    """Rewrite ckpt/router.pth so that each group skips `sparsity` of random tokens; returns measure()."""
    import torch

    from wide_export.checkpoint import load_wide_model

    if not 0.0 <= sparsity < 1.0:
        raise ValueError(f"sparsity {sparsity} must be in [0, 1)")
    model = load_wide_model(ckpt, checksums=False).model
    ids = _random_ids(model.config.vocab_size, tokens, seed)
    for layer in range(len(model.model.layers)):
        for kind in ("attention", "ffn"):  # the FFN router reads the stream after the attention's groups
            if _router(model, layer, kind) is None:
                continue
            margin = _margins(model, ids)[layer][kind]
            bias = _router(model, layer, kind).router.bias
            with torch.no_grad():
                if sparsity == 0:
                    bias[0::2] += ALWAYS
                else:  # the s-quantile of each group's margin becomes its tie
                    bias[0::2] -= torch.quantile(margin.float(), sparsity, dim=0)
    state = torch.load(ckpt / "router.pth", weights_only=True)
    for name in state:
        if name.endswith(".router.bias"):
            parts = name.split(".")
            layer, kind = int(parts[parts.index("layers") + 1]), parts[-3].removeprefix("router_")
            state[name] = _router(model, layer, kind).router.bias.detach().to(state[name].dtype).clone()
    torch.save(state, ckpt / "router.pth")
    return measure(model, seed=seed + 1, tokens=tokens)


def measure(model, *, seed: int = 1, tokens: int = 512) -> dict[str, float]:
    """The fraction of groups skipped per kind ('attention', 'ffn'), over random tokens and every layer."""
    ids = _random_ids(model.config.vocab_size, tokens, seed)
    skipped: dict[str, list[float]] = {}
    for per_layer in _margins(model, ids):
        for kind, margin in per_layer.items():
            skipped.setdefault(kind, []).append(float((margin < 0).float().mean()))
    return {kind: sum(v) / len(v) for kind, v in skipped.items()}
