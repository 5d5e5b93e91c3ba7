"""The package's import arrows (docs/architecture.md, "Layers"): every import of a wide_export module, at the top
of a file or inside a function, points to the same layer or one below, and no modules import each other in a
cycle. Read from the source with ast (nothing is imported)."""

from __future__ import annotations

import ast
import collections
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "wide_export"

# Each folder of wide_export is one layer (docs/architecture.md, "Layers"); a module may import its own folder or a
# folder on a LOWER layer, never a sibling on its own layer or one above. The package's face (wide_export/__init__.py)
# is plumbing. Every folder must be listed: a new folder takes its place here, on purpose.
LAYERS = {
    "base": 0,
    "ops": 1,
    "kernels": 2, "cpu": 2, "native": 2,
    "model": 3,
    "checkpoint": 4,
    "generation": 5,
    "verify": 6,
    "export": 7,
    "trt": 8, "tp": 8,
    "tritonserver": 9, "pipelines": 9, "analyze": 9,
    "serving": 10,
    "vllm": 11,
    "bench": 12,
    "cli": 13,
    "__main__": 14,
}


def folder(module: str) -> str:
    """The top folder below wide_export ("" for the package's face)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def layer(module: str) -> float:
    """The folder's layer; the package's face (which hands on base's WideError) sits just above base."""
    return LAYERS[folder(module)] if folder(module) else 0.5


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(path: Path) -> list[str]:
    """Every wide_export name a file imports (`from a.b import c` gives a.b.c: c may be a module)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("wide_export"):
            names += [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names += [a.name for a in node.names if a.name.startswith("wide_export")]
    return names


def _graph() -> dict[str, set[str]]:
    modules = _modules()

    def resolve(name: str) -> str:
        while name not in modules and "." in name:
            name = name.rsplit(".", 1)[0]
        return name

    return {m: {resolve(n) for n in _imports(p)} - {m} for m, p in modules.items()}


def upward_arrows(graph: dict[str, set[str]]) -> list[str]:
    """Imports of another folder on the same layer or one above."""
    return sorted(f"{m} (layer {layer(m)}) -> {t} (layer {layer(t)})" for m, targets in graph.items()
                  for t in targets if folder(t) != folder(m) and folder(t) and layer(t) >= layer(m))


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_every_module_lies_in_a_folder_of_a_layer():
    """No module outside the layer folders (the package's face and __main__ aside), no folder without a layer."""
    assert sorted({folder(m) for m in _modules()} - set(LAYERS) - {""}) == []
    assert sorted(m for m in _modules() if m.count(".") == 1 and folder(m) not in LAYERS) == []


def test_no_import_runs_up_a_layer():
    assert upward_arrows(_graph()) == []


def test_no_modules_import_each_other_in_a_cycle():
    assert cycles(_graph()) == []


def test_the_checks_see_an_upward_arrow_a_sibling_arrow_and_a_cycle():
    """The checks themselves, on a made-up graph: a model module importing the CLI, trt importing its sibling tp,
    two bench modules in a ring; model importing ops (below) and the package's face pass."""
    graph = {"wide_export.model.x": {"wide_export.cli.y", "wide_export.ops.z", "wide_export"},
             "wide_export.cli.y": set(), "wide_export.trt.a": {"wide_export.tp.b"},
             "wide_export.bench.a": {"wide_export.bench.b"}, "wide_export.bench.b": {"wide_export.bench.c"},
             "wide_export.bench.c": {"wide_export.bench.a"}}
    assert upward_arrows(graph) == ["wide_export.model.x (layer 3) -> wide_export.cli.y (layer 13)",
                                    "wide_export.trt.a (layer 8) -> wide_export.tp.b (layer 8)"]
    assert cycles(graph) == [["wide_export.bench.a", "wide_export.bench.b", "wide_export.bench.c"]]
    assert layer("wide_export.serving.cpu_engine") == 10 and layer("wide_export.cpu.ops") == 2
    assert layer("wide_export.base.paths") == 0 and layer("wide_export") == 0.5
