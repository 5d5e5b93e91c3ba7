"""`wide-export verify --onnx OUT` of a sharded export: every rank in ONNX Runtime, the all-reduces simulated.

Each rank's graph is cut at its DistCollective nodes into stages (the nodes between two collectives, in the
graph's order); a stage's inputs are graph inputs or values of earlier stages, its outputs what later
stages, the graph outputs or the next collective need. Per step, stage s runs on every rank, the partial
outputs entering collective s are summed over the ranks (float32, rank order) -- what NCCL's all-reduce
computes -- and the sum is every rank's collective output. ONNX Runtime never sees a DistCollective node.

The result is compared with the UNSHARDED PyTorch reference: logits, the KV cache (the ranks' presents
concatenated over the KV-head axis), and every router decision (rank 0's masks, put back in checkpoint
group order; every rank's masks must be identical). Besides the single-device tolerances, a sharded float32
export must hold max |err| / max |ref| <= 1e-5 per output and identical router decisions.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from wide_export.errors import WideError
from wide_export.tp.plan import FORMAT, MANIFEST

STRICT_REL = {"float32": 1e-5}  # max |err| / max |ref| per output (the exactness criterion of a TP export)


def is_tp_export(folder: Path) -> bool:
    return (Path(folder) / MANIFEST).is_file()


def read_manifest(folder: Path) -> dict[str, Any]:
    from wide_export.paths import confined, read_json

    folder = Path(folder)
    hint = "re-run `wide-export onnx --tp N`"
    m = read_json(confined(folder / MANIFEST, folder, "tp manifest"), hint=hint)
    if not isinstance(m, dict) or m.get("format") != FORMAT or not isinstance(m.get("ranks"), list) \
            or len(m["ranks"]) != m.get("world_size"):
        raise WideError(f"{folder / MANIFEST} is not a tensor-parallel export's manifest", hint)
    for r in m["ranks"]:
        rank_dir = confined(folder / str(r.get("folder", "")), folder, f"{folder / MANIFEST}: rank folder")
        if not (rank_dir / "model.onnx").is_file():
            raise WideError(f"{folder / str(r.get('folder', ''))} has no model.onnx", hint)
    return m


@dataclass
class _Stage:
    nodes: list
    inputs: list[str]
    outputs: list[str]
    collective: Any  # the DistCollective node ending the stage (None for the last)
    session: Any = None


class RankRunner:
    """One rank's graph as stages between its collectives."""

    def __init__(self, folder: Path, extra_outputs: list[str]):
        from wide_export.paths import load_graph

        self.folder = Path(folder)
        self.proto = load_graph(self.folder / "model.onnx")
        g = self.proto.graph
        nodes = list(g.node)
        cuts = [k for k, n in enumerate(nodes) if n.op_type == "DistCollective"]
        self.collectives = [nodes[k] for k in cuts]
        inits = {t.name for t in g.initializer}
        finals = {o.name for o in g.output} | set(extra_outputs)
        last_use: dict[str, int] = {}
        for k, n in enumerate(nodes):
            for v in n.input:
                last_use[v] = k
        self.stages = []
        bounds = [-1, *cuts, len(nodes)]
        for s in range(len(bounds) - 1):
            lo, hi = bounds[s] + 1, bounds[s + 1]
            part = nodes[lo:hi]
            made = {o for n in part for o in n.output if o}
            needed = list(dict.fromkeys(v for n in part for v in n.input if v and v not in made and v not in inits))
            coll = nodes[hi] if hi < len(nodes) else None
            outs = [o for o in dict.fromkeys(o for n in part for o in n.output if o)
                    if o in finals or last_use.get(o, -1) >= hi]
            self.stages.append(_Stage(part, needed, outs, coll))
        self.output_names = [o.name for o in g.output]

    def _session(self, stage: _Stage, env: dict):
        import onnx

        from wide_export.verify.onnx_verify import debug_session

        g = self.proto.graph
        used = {v for n in stage.nodes for v in n.input}
        graph = onnx.helper.make_graph(
            stage.nodes, "stage",
            [onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(env[n].dtype), None)
             for n in stage.inputs],
            [onnx.ValueInfoProto(name=n) for n in stage.outputs],
            [t for t in g.initializer if t.name in used])
        model = onnx.helper.make_model(graph, opset_imports=list(self.proto.opset_import),
                                       functions=list(self.proto.functions), ir_version=self.proto.ir_version)
        config = {"files": {"model": "model.onnx"}}
        return debug_session(self.folder, config, model.SerializeToString())

    def run_stage(self, s: int, env: dict) -> None:
        stage = self.stages[s]
        if stage.session is None:
            stage.session = self._session(stage, env)
        got = stage.session.run(stage.outputs, {n: env[n] for n in stage.inputs})
        env.update(zip(stage.outputs, got))


class SimulatedWorld:
    """All ranks of a sharded export, run step by step with summed partials at every DistCollective."""

    def __init__(self, folder: Path, manifest: dict, mask_names: list[str]):
        self.runners = [RankRunner(Path(folder) / r["folder"], mask_names) for r in manifest["ranks"]]
        counts = {len(r.stages) for r in self.runners}
        names = {tuple(n.name for n in r.collectives) for r in self.runners}
        if len(counts) != 1 or len(names) != 1:
            raise WideError("the ranks' graphs do not have the same collectives", "re-run `wide-export onnx --tp N`")
        self.rank_disagreement = 0.0  # largest difference between the ranks' replicated outputs (logits)

    def run(self, feeds: list[dict]) -> list[dict]:
        envs = [dict(f) for f in feeds]
        for s in range(len(self.runners[0].stages)):
            for runner, env in zip(self.runners, envs):
                runner.run_stage(s, env)
            coll = self.runners[0].stages[s].collective
            if coll is not None:
                total = envs[0][coll.input[0]].copy()
                for env in envs[1:]:
                    total = total + env[coll.input[0]]
                for env in envs:
                    env[coll.output[0]] = total
        return envs


def verify_tp(onnx_dir: Path, *, loaded=None, report_path: Path | None = None, stages=None,
              load_kwargs: dict | None = None, **settings):
    """Verify a sharded export against the unsharded reference (see the module docstring)."""
    from wide_export.progress import Stages
    from wide_export.export.onnx_export import read_wide_config
    from wide_export.verify.compare import OutputRow, VerifyReport, compare
    from wide_export.verify.onnx_verify import DEFAULTS, check_same_model, quiet_polygraphy, reference_for
    from wide_export.verify.reference import reference_steps
    from wide_export.verify.tolerances import Tolerance, tolerance_for

    stages = stages or Stages(quiet=True)
    settings = {**DEFAULTS, **{k: v for k, v in settings.items() if v is not None and k in DEFAULTS}}
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
                elif r:
                    feed = {**feed, **{n: v for n, v in steps[0].feed.items() if n.startswith("past_")}}
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
