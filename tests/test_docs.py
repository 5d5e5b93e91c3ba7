"""The docs a user reads first: README's checkpoint layout is what the loader takes, and nothing the
repository ships points at files outside it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _section(title: str) -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index(f"## {title}\n")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def test_readme_router_layout_loads_as_written(tmp_path):
    """A router.pth built from README's table alone (keys and shapes, R and G picked here) loads, and the
    geometry read off it is the one the table implies."""
    import torch

    from tests.helpers import make_checkpoint
    from wide_export.checkpoint import load_wide_model

    rows = re.findall(r"^\| `(model\.layers\.\{i\}\.router_\{attention\\\|ffn\}\.[a-z.]+)` \| `\[([^\]]+)\]` \|$",
                      _section("Bring your own checkpoint"), re.M)
    assert len(rows) == 4, rows
    ck = make_checkpoint(tmp_path / "ck", num_layers=2)  # hidden 64, 8 heads, 192 FFN channels
    H, sizes = 64, {"attention": (8, 4), "ffn": (12, 6)}  # (G, R) per router kind, chosen here
    state = {}
    for layer in range(2):
        for kind, (G, R) in sizes.items():
            for key, shape in rows:
                name = key.replace("{i}", str(layer)).replace("{attention\\|ffn}", kind)
                dims = [{"R": R, "H": H, "2G": 2 * G}[d.strip()] for d in shape.split(",")]
                state["base_model.model." + name] = torch.randn(*dims).to(torch.bfloat16)  # a wrapper prefix
    path = tmp_path / "router.pth"
    torch.save(state, path)
    cfg = load_wide_model(ck, router=path).config
    for r in cfg.routing:
        assert (r.attn_groups, r.attn_rank, r.ffn_groups, r.ffn_rank) == (8, 4, 12, 6)
    assert cfg.attn_group_size(0) == 8 // 8 and cfg.ffn_group_size(0) == 192 // 12


OUTSIDE = re.compile(r"\.\./shared|SEEN-HERE|SERVING-ANCHORS|CONVENTIONS\.md|shared/WIDE")


SUFFIXES = (".md", ".txt", ".py", ".sh", ".cpp", ".h", ".cu", ".pbtxt", ".toml", ".tmpl", ".json", "")


def test_nothing_points_outside_the_repository():
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    hits = []
    for name in files:
        path = ROOT / name
        if Path(name).suffix not in SUFFIXES or not path.is_file() or name == "tests/test_docs.py":
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if OUTSIDE.search(line):
                hits.append(f"{name}:{n}: {line.strip()[:100]}")
    assert not hits, "\n".join(hits)


def test_the_serving_extra_goes_into_its_own_environment():
    """`pip install -e '.[triton]'` into the main environment downgrades numpy 2 -> 1.26:
    every doc line that installs the extra does it in .venv-serve."""
    bad = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for n, line in enumerate(doc.read_text().splitlines(), 1):
            if "pip install" in line and "[triton]" in line and ".venv-serve" not in line:
                bad.append(f"{doc.name}:{n}: {line.strip()}")
    assert not bad, "\n".join(bad)
    assert "python3 -m venv .venv-serve && . .venv-serve/bin/activate && pip install -e '.[triton]'" in (
        ROOT / "README.md").read_text()


def test_every_environment_draws_the_benchmark_plots():
    """The plots are drawn with matplotlib: a main dependency, so the main, serving and vLLM environments
    (which install the project with its dependencies) all have it."""
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert any(re.match(r"matplotlib\b", d) for d in deps), deps
    plotters = [p for p in (ROOT / "wide_export").rglob("*.py") if "import matplotlib" in p.read_text()]
    assert plotters  # the benchmarks' plot writers import it lazily


def test_the_environment_the_readme_says_runs_trt_has_a_tensorrt():
    """README: "Every command runs from `.venv-serve` (export, trt, triton, serve)". The extras that
    environment's install line names must bring a TensorRT `trt` can load (tensorrt or tensorrt_rtx,
    wide_export/trt/loaders.py); `trt` there failed with "no usable TensorRT"."""
    import tomllib

    text = (ROOT / "README.md").read_text()
    claim = re.search(r"Every command runs from `(\.venv-[a-z]+)` \(([^)]*)\)", text)
    assert claim, "README no longer says which environment runs every command"
    env, commands = claim.group(1), {c.strip() for c in claim.group(2).split(",")}
    install = re.search(rf"python3 -m venv {re.escape(env)} && \. {re.escape(env)}/bin/activate && "
                        r"pip install -e '\.\[([a-z0-9,-]+)\]'", text)
    assert install, f"README has no install line for {env}"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [d for extra in install.group(1).split(",") for d in project["optional-dependencies"][extra]]
    wanted += project["dependencies"]
    assert "trt" in commands, commands
    assert any(re.match(r"tensorrt(-rtx)?(-cu\d+)?\b", d) for d in wanted), (env, install.group(1), wanted)
