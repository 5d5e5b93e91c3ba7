"""The package's import arrows (docs/architecture.md, "Layers"): every import of a wide_export module, at the top
of a file or inside a function, points to the same layer or one below, and no modules import each other in a
cycle. Read from the source with ast (nothing is imported)."""

from __future__ import annotations

import ast
import collections
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "wide_export"

# the longest matching prefix of a module's path below wide_export decides its layer; the rest is plumbing (0)
LAYERS = {
    "__main__": 7,
    "cli": 6,
    "bench": 5, "analyze": 5,
    "frontend": 4, "triton": 4, "vllm": 4, "cpu.engine": 4, "cpu.serve": 4,
    "export": 3, "tp": 3, "trt": 3, "verify": 3, "native": 3, "cpu.generation": 3,
    "checkpoint": 2,
    "model": 1, "ops": 1, "kernels": 1, "cpu": 1,
}


def layer(module: str) -> int:
    parts = module.split(".")[1:]
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in LAYERS:
            return LAYERS[".".join(parts[:n])]
    return 0


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
    return sorted(f"{m} (layer {layer(m)}) -> {t} (layer {layer(t)})"
                  for m, targets in graph.items() for t in targets if layer(t) > layer(m))


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


def test_no_import_runs_up_a_layer():
    assert upward_arrows(_graph()) == []


def test_no_modules_import_each_other_in_a_cycle():
    assert cycles(_graph()) == []


def test_the_checks_see_an_upward_arrow_and_a_cycle():
    """The checks themselves, on a made-up graph: a model module importing the CLI, two bench modules in a ring."""
    graph = {"wide_export.model.x": {"wide_export.cli.y"}, "wide_export.cli.y": set(),
             "wide_export.bench.a": {"wide_export.bench.b"}, "wide_export.bench.b": {"wide_export.bench.c"},
             "wide_export.bench.c": {"wide_export.bench.a"}}
    assert upward_arrows(graph) == ["wide_export.model.x (layer 1) -> wide_export.cli.y (layer 6)"]
    assert cycles(graph) == [["wide_export.bench.a", "wide_export.bench.b", "wide_export.bench.c"]]
    assert layer("wide_export.cpu.engine") == 4 and layer("wide_export.cpu.ops") == 1 and layer("wide_export.paths") == 0
