"""The tensorrt flavour's generation model (BLS) on a real server, without TensorRT:
the generated tensorrt_plan configs keep their I/O blocks (what Triton checks every
BLS request against) but run a Python stand-in that executes the tiny ONNX model.
Tokens must equal the numpy reference exactly."""

from __future__ import annotations

import json

import numpy as np

from wide_export.tritonserver import RepoOptions, TritonServer, generate_repository
from wide_export.tritonserver.client import GenerationClient

from tests.triton import tiny_llm
from tests.triton.engine_manifest import write_engine_folder

STAND_IN = '''
import json, os
import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Stand-in for a tensorrt_plan model: same I/O, runs model.onnx."""

    def initialize(self, args):
        cfg = json.loads(args["model_config"])
        self.inputs = [t["name"] for t in cfg["input"]]
        self.outputs = [t["name"] for t in cfg["output"]]
        folder = os.path.join(args["model_repository"], args["model_version"])
        self.session = ort.InferenceSession(os.path.join(folder, "model.onnx"))

    def execute(self, requests):
        responses = []
        for request in requests:
            feeds = {n: pb_utils.get_input_tensor_by_name(request, n).as_numpy() for n in self.inputs}
            outs = self.session.run(self.outputs, feeds)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor(n, v) for n, v in zip(self.outputs, outs)]))
        return responses
'''


def use_stand_in_engine(repo, onnx_folder) -> None:
    """Replace the repository's tensorrt_plan model by the Python stand-in, keeping its I/O config.

    This server has no GPU: the generation model asks for host outputs ("kv_cache_memory": "cpu")
    and keeps the cache as numpy; the GPU path is tested with a fake pb_utils in
    test_triton_bls_device.py."""
    settings_file = repo / "wide_llm" / "1" / "generation.json"
    settings = json.loads(settings_file.read_text())
    assert settings["kv_cache_memory"] == "gpu"
    settings_file.write_text(json.dumps({**settings, "kv_cache_memory": "cpu"}))
    model = repo / settings["engine_model"]  # one model, both profiles: the stand-in serves both phases
    config = (model / "config.pbtxt").read_text()
    config = config[:config.index("instance_group")] + "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
    (model / "config.pbtxt").write_text(config.replace('platform: "tensorrt_plan"', 'backend: "python"'))
    (model / "1" / "model.plan").unlink()
    (model / "1" / "model.onnx").write_bytes((onnx_folder / "model.onnx").read_bytes())
    (model / "1" / "model.py").write_text(STAND_IN)


def test_bls_generation_over_stand_in_engines(tiny, tmp_path, rng):
    folder, weights = tiny
    write_engine_folder(tmp_path / "engines", layers=tiny_llm.LAYERS, vocab=tiny_llm.VOCAB, kv_type="float32",
                        heads=tiny_llm.KV_HEADS, dim=tiny_llm.HEAD_DIM, max_pos=tiny_llm.MAX_POS)
    repo = generate_repository(tmp_path / "repo", engines=tmp_path / "engines", options=RepoOptions(max_batch=4))
    use_stand_in_engine(repo, folder)
    with TritonServer(repo) as server:
        with GenerationClient(server.endpoints.grpc, "grpc") as client:
            for _ in range(3):
                prompt = rng.integers(0, tiny_llm.VOCAB, size=int(rng.integers(1, 12)))
                n = int(rng.integers(1, 8))
                np.testing.assert_array_equal(client.generate(prompt, n),
                                              tiny_llm.reference_greedy(weights, prompt, n))
            batch = rng.integers(0, tiny_llm.VOCAB, size=(2, 5))
            got = client.generate(batch, 4)
            for row, prompt in zip(got, batch):
                np.testing.assert_array_equal(row, tiny_llm.reference_greedy(weights, prompt, 4))
