"""Fixtures for the Triton tests: a tiny contract model, the real demo export, repositories.

Random inputs are seeded: $WIDE_TEST_SEED (default 0) mixed with the test's id, so a failure
reproduces by rerunning the same test with the same WIDE_TEST_SEED; set another value to vary them.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import numpy as np
import pytest

from tests.triton import tiny_llm
from tests.triton.support import serve_until_teardown

SEED = int(os.environ.get("WIDE_TEST_SEED", "0"))


@pytest.fixture
def rng(request) -> np.random.Generator:
    """This test's random generator: WIDE_TEST_SEED and the test id decide every draw."""
    return np.random.default_rng([SEED, zlib.crc32(request.node.nodeid.encode())])


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """(folder, weights) of the tiny contract model, random weights from WIDE_TEST_SEED."""
    folder = tmp_path_factory.mktemp("tiny_onnx")
    return folder, tiny_llm.write_tiny_model(folder, SEED)


@pytest.fixture(scope="module")
def gm(tiny_repo):
    """The tiny repository's generated model.py, imported outside Triton."""
    from tests.triton.support import load_generation_module

    return load_generation_module(tiny_repo / "wide_llm" / "1")


@pytest.fixture(scope="module")
def inflight(gm):
    """Its generation/decoding.py (the generation loop), as model.py loads it."""
    return gm.load_decoding()


@pytest.fixture(scope="module")
def runner(gm, tiny_repo):
    """(settings, ONNX Runtime step) of the tiny repository."""
    folder = str(tiny_repo / "wide_llm" / "1")
    settings = gm.Settings.load(folder)
    return settings, gm.ort_step(folder, settings)


@pytest.fixture(scope="session")
def tiny_repo(tiny, tmp_path_factory) -> Path:
    from wide_export.tritonserver import generate_repository

    return generate_repository(tmp_path_factory.mktemp("tiny") / "repo", onnx=tiny[0])


@pytest.fixture(scope="session")
def demo_repo(demo_onnx, tmp_path_factory) -> Path:
    from wide_export.tritonserver import RepoOptions, generate_repository

    return generate_repository(tmp_path_factory.mktemp("demo_repo") / "repo", onnx=demo_onnx,
                               options=RepoOptions(max_batch=8))


@pytest.fixture(scope="session")
def demo_server(demo_repo):
    """A real tritonserver on 127.0.0.1 serving the demo repository."""
    for server in serve_until_teardown(demo_repo):
        assert server.endpoints.http.startswith("127.0.0.1:") and server.endpoints.grpc.startswith("127.0.0.1:")
        yield server


@pytest.fixture(scope="session")
def reference():
    """fn(prompt [T], n) -> the PyTorch reference's greedy tokens (demo model): n of them, or fewer
    when one is the demo config's eos id (transformers' `generate` stops there, eos included)."""
    import torch

    from wide_export.checkpoint.demo import demo_model
    from wide_export.model.demo import DEMO_SPEC
    from wide_export.generation.torch_step import greedy_generate

    model = demo_model().eval()
    eos = DEMO_SPEC.hf_config().eos_token_id

    def tokens(prompt: np.ndarray, n: int, stop_at_eos: bool = True) -> np.ndarray:
        ids = torch.from_numpy(np.asarray(prompt, dtype=np.int64)).reshape(1, -1)
        with torch.no_grad():
            out = greedy_generate(model, ids, torch.ones_like(ids), n)[0].numpy()
        hits = np.flatnonzero(out == eos)
        return out[:hits[0] + 1] if stop_at_eos and hits.size else out

    tokens.eos = eos
    return tokens
