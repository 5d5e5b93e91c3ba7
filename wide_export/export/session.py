"""An ONNX Runtime session of an export folder with every router decision as an extra graph output: what
verification, `analyze --onnx` and the sharded runner (tp/ranks.py) run the graph through."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def with_masks(onnx_dir: Path, config: dict[str, Any]):
    """model.onnx (an onnx.ModelProto, weights not loaded) with the router masks as extra graph outputs."""
    import onnx

    from wide_export.base.paths import load_graph

    proto = load_graph(Path(onnx_dir) / config["files"]["model"])
    known = {o.name for o in proto.graph.output}
    for layer in config["layers"]:
        for kind in ("attention", "ffn"):
            if layer[kind] and layer[kind]["mask"] not in known:
                proto.graph.output.append(onnx.helper.make_tensor_value_info(layer[kind]["mask"],
                                                                             onnx.TensorProto.INT32, None))
    return proto


def check_graph_files(onnx_dir: Path, config: dict[str, Any]) -> None:
    """model.onnx parses and its external-data locations lie inside onnx_dir -- checked before the
    reference is built or ONNX Runtime opens anything."""
    from wide_export.base.paths import external_data_files, load_graph

    graph = Path(onnx_dir) / config["files"]["model"]
    external_data_files(load_graph(graph), graph)


def debug_session(onnx_dir: Path, config: dict[str, Any], model: bytes | None = None):
    """An ONNX Runtime CPU session of with_masks() (or of `model`, a serialized graph whose
    external weights are the export's). External weights are read from the export folder itself (a copy
    or link of them elsewhere is refused by ONNX Runtime as a path escape)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.add_session_config_entry("session.model_external_initializers_file_folder_path",
                                     str(Path(onnx_dir).resolve()))
    return ort.InferenceSession(model or with_masks(onnx_dir, config).SerializeToString(), options,
                                providers=["CPUExecutionProvider"])
