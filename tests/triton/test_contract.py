"""The generation model's I/O contract (tritonserver/contract.py) is the one source of every tensor name and dtype: the
config.pbtxt a repository carries is rendered from it, and the model files copied into a repository import
without wide_export (a fresh Python that cannot import the package loads them from the folder)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from wide_export.tritonserver import contract

# The config.pbtxt entries as the repository wrote them by hand before the contract existed (what clients rely
# on): name -> (data_type, dims, optional, allow_ragged_batch).
WRITTEN_BEFORE = {
    "input_ids": ("TYPE_INT64", "[ -1 ]", True, True), "text_input": ("TYPE_STRING", "[ 1 ]", True, False),
    "add_special_tokens": ("TYPE_BOOL", "[ 1 ]", True, False), "max_new_tokens": ("TYPE_INT32", "[ 1 ]", True, False),
    "temperature": ("TYPE_FP32", "[ 1 ]", True, False), "top_p": ("TYPE_FP32", "[ 1 ]", True, False),
    "seed": ("TYPE_INT64", "[ 1 ]", True, False), "stop_token_ids": ("TYPE_INT64", "[ -1 ]", True, True),
    "stop_words": ("TYPE_STRING", "[ -1 ]", True, True), "ignore_eos": ("TYPE_BOOL", "[ 1 ]", True, False),
    "output_ids": ("TYPE_INT64", "[ -1 ]", False, False), "text_output": ("TYPE_STRING", "[ 1 ]", False, False),
    "finish_reason": ("TYPE_STRING", "[ 1 ]", False, False),
    "num_input_tokens": ("TYPE_INT32", "[ 1 ]", False, False),
    "num_output_tokens": ("TYPE_INT32", "[ 1 ]", False, False),
}


def _entries(config: str) -> dict:
    """name -> (data_type, dims, optional, ragged) of every tensor entry of a config.pbtxt's text."""
    import re

    out = {}
    for m in re.finditer(r'\{ name: "(\w+)" data_type: (\w+) dims: (\[[^\]]*\])([^}]*)\}', config):
        rest = m.group(4)
        out[m.group(1)] = (m.group(2), m.group(3), "optional: true" in rest, "allow_ragged_batch: true" in rest)
    return out


def test_the_repositorys_config_lists_the_contracts_tensors(tiny_repo):
    config = (tiny_repo / "wide_llm" / "config.pbtxt").read_text()
    assert _entries(config) == WRITTEN_BEFORE
    assert [t.name for t in contract.INPUTS] == list(WRITTEN_BEFORE)[:10]
    assert contract.OUTPUT_NAMES == tuple(WRITTEN_BEFORE)[10:]
    assert contract.client_dtype("stop_words") == "BYTES" and contract.client_dtype("seed") == "INT64"


def test_the_copied_model_files_import_without_wide_export(tiny_repo, tmp_path):
    """model.py and its siblings, as the repository holds them, in a Python where `import wide_export` fails:
    the model loads its contract, text, in-flight and metrics modules from its own folder."""
    folder = tiny_repo / "wide_llm" / "1"
    assert (folder / "contract.py").read_text() == Path(contract.__file__).read_text()
    code = textwrap.dedent(f"""
        import importlib.abc, importlib.util, sys

        class NoWideExport(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name == "wide_export" or name.startswith("wide_export."):
                    raise ImportError("wide_export is not installed here")
                return None

        sys.meta_path.insert(0, NoWideExport())
        try:
            import wide_export
        except ImportError:
            pass
        else:
            raise SystemExit("the blocker failed")
        spec = importlib.util.spec_from_file_location("model", {str(folder / "model.py")!r})
        model = importlib.util.module_from_spec(spec)
        sys.modules["model"] = model  # as Triton's Python backend loads it
        spec.loader.exec_module(model)
        for name in ("contract", "settings", "rows", "ortstep", "textgen", "decoding", "metrics"):
            model.load_sibling(name)
        print(model.C.INPUT_IDS, len(model.C.INPUTS), len(model.C.OUTPUT_NAMES),
              any(m.startswith("wide_export") for m in sys.modules))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["input_ids", "10", "5", "False"]


def test_pbtxt_entries_by_hand():
    tensors = (contract.Tensor("a", "INT64", (-1, 4), optional=True, ragged=True), contract.Tensor("b", "FP32", (1,)))
    assert contract.pbtxt(tensors) == (
        '  { name: "a" data_type: TYPE_INT64 dims: [ -1, 4 ] optional: true allow_ragged_batch: true },\n'
        '  { name: "b" data_type: TYPE_FP32 dims: [ 1 ] }')
    assert contract.pbtxt(()) == ""
