"""A sharded (tensor-parallel) export run on one machine: its manifest, each rank's graph as stages between its
DistCollective nodes, and all ranks stepped together with every all-reduce simulated (what `run-tp` serves and
tp/verify.py compares with the reference).

Each rank's graph is cut at its DistCollective nodes into stages (the nodes between two collectives, in the
graph's order); a stage's inputs are graph inputs or values of earlier stages, its outputs what later
stages, the graph outputs or the next collective need. Per step, stage s runs on every rank, the partial
outputs entering collective s are summed over the ranks (float32, rank order) -- what NCCL's all-reduce
computes -- and the sum is every rank's collective output. ONNX Runtime never sees a DistCollective node.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wide_export.base.errors import WideError
from wide_export.tp.plan import FORMAT, MANIFEST


def is_tp_export(folder: Path) -> bool:
    return (Path(folder) / MANIFEST).is_file()


def read_manifest(folder: Path) -> dict[str, Any]:
    from wide_export.base.paths import confined, read_json

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
        from wide_export.base.paths import load_graph

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

        from wide_export.export.session import debug_session

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
