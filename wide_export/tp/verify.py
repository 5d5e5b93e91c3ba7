"""`wide-export verify --onnx OUT` of a sharded export: every rank in ONNX Runtime, the all-reduces simulated
(tp/ranks.py), against the UNSHARDED PyTorch reference.

Compared: logits, the KV cache (the ranks' presents concatenated over the KV-head axis), and every router
decision (rank 0's masks, put back in checkpoint group order; every rank's masks must be identical). Besides
the single-device tolerances, a sharded float32 export must hold max |err| / max |ref| <= 1e-5 per output and
identical router decisions.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from wide_export.base.errors import WideError
from wide_export.tp.ranks import SimulatedWorld, read_manifest

STRICT_REL = {"float32": 1e-5}  # max |err| / max |ref| per output (the exactness criterion of a TP export)


def verify_tp(onnx_dir: Path, *, loaded=None, report_path: Path | None = None, stages=None,
              load_kwargs: dict | None = None, **settings):
    """Verify a sharded export against the unsharded reference (see the module docstring)."""
    from wide_export.base.progress import Stages
    from wide_export.export.onnx_export import read_wide_config
    from wide_export.verify.compare import OutputRow, VerifyReport, compare
    from wide_export.verify.common import check_same_model, quiet_polygraphy, reference_for, with_defaults
    from wide_export.verify.reference import reference_steps
    from wide_export.verify.tolerances import Tolerance, tolerance_for

    stages = stages or Stages(quiet=True)
    settings = with_defaults(settings)
    onnx_dir = Path(onnx_dir)
    manifest = read_manifest(onnx_dir)
    config0 = read_wide_config(onnx_dir / manifest["ranks"][0]["folder"])
    dtype = config0["dtype"]
    if dtype == "bfloat16":
        raise WideError("a bfloat16 tensor-parallel export cannot be verified on CPU yet",
                        "export with --dtype float32 (exactness) or float16 to verify it")
    base = tolerance_for(dtype)
    strict = STRICT_REL.get(dtype)
    tol = Tolerance(base.atol, base.rtol, base.stat, 1.0 if strict else base.min_agreement,
                    0.0 if strict else base.flip_margin)
    quiet_polygraphy()
    with stages.stage("reference"):
        model = reference_for(config0, loaded, **(load_kwargs or {}))
        ref_cfg = {k: config0[k] for k in ("num_layers", "hidden_size", "vocab_size", "head_dim")}
        ref_cfg["num_key_value_heads"] = config0["num_key_value_heads"] * manifest["world_size"]
        check_same_model(model, ref_cfg)
        steps = reference_steps(model, kv_dtype=dtype, **settings)
    masks = [layer[k]["mask"] for layer in config0["layers"] for k in ("attention", "ffn") if layer[k]]
    orders = {layer["ffn"]["mask"]: layer["ffn"]["group_order"] for layer in config0["layers"] if layer["ffn"]}
    n_layers = config0["num_layers"]
    report = VerifyReport(f"onnxruntime x {manifest['world_size']} ranks (all-reduce simulated)", dtype,
                          {**tol.to_dict(), "max_rel_to_max_ref": strict}, {**settings, "tp": manifest["world_size"]})
    outs: list[dict] = []
    rank_diff = 0.0
    mask_mismatch = 0
    with stages.stage("onnxrt x ranks"):
        world = SimulatedWorld(onnx_dir, manifest, masks)
        prev: list[dict] | None = None
        for k, step in enumerate(steps):
            feeds = []
            for r in range(manifest["world_size"]):
                feed = dict(step.feed)
                if k:
                    for i in range(n_layers):
                        for kv in ("key", "value"):
                            feed[f"past_key_values.{i}.{kv}"] = prev[r][f"present.{i}.{kv}"]
                feeds.append(feed)
            envs = world.run(feeds)
            prev = envs
            out = {"logits": envs[0]["logits"]}
            rank_diff = max(rank_diff, *(float(np.abs(e["logits"] - envs[0]["logits"]).max()) for e in envs))
            for i in range(n_layers):
                for kv in ("key", "value"):
                    name = f"present.{i}.{kv}"
                    out[name] = np.concatenate([e[name] for e in envs], axis=1)
            for name in masks:
                got = envs[0][name]
                mask_mismatch += sum(int((e[name] != got).sum()) for e in envs[1:])
                if name in orders:  # graph group j is the checkpoint's group order[j]
                    back = np.empty_like(got)
                    back[..., orders[name]] = got
                    got = back
                out[name] = got
            outs.append(out)
    compare(steps, outs, tol, report, "onnxrt")
    report.notes.append(f"{manifest['world_size']} ranks; the replicated logits of the ranks differ by at most "
                        f"{rank_diff:.1e}; {mask_mismatch} router decisions differ between ranks")
    if strict is not None:
        presents = [n for n in steps[0].ref if n.startswith("present.")]
        for label, names in (("logits", ["logits"]), (f"present.* ({n_layers} layers)", presents)):
            rel = max(_rel(steps, outs, n) for n in names)
            report.outputs.append(OutputRow(f"tp exact: {label} max|err|/max|ref|", rel, rel, rel, rel <= strict))
    if mask_mismatch or rank_diff:
        report.outputs.append(OutputRow("tp: ranks agree (logits, masks)", rank_diff, 0.0, float(mask_mismatch),
                                        False))
    if report_path:
        report.write(report_path)
    return report


def _rel(steps, outs, name: str) -> float:
    ref = np.concatenate([s.ref[name].ravel() for s in steps])
    got = np.concatenate([o[name].astype(np.float32).ravel() for o in outs])
    return float(np.abs(got - ref).max() / max(float(np.abs(ref).max()), 1e-30))
