"""The tensorrt flavour's generation model keeps the KV cache on the device, checked without a
GPU against a fake pb_utils (tests/triton/fake_pb_utils.py) whose BLS responses are "GPU"
tensors that refuse as_numpy(): every BLS request goes to the one tensorrt_plan model and
asks for GPU outputs, each step's presents go back unchanged (DLPack renames of the very
objects) as the next past, in-flight joins and leaves rebuild the cache with PyTorch over
DLPack, and greedy tokens equal the numpy full-recompute reference. The fake device is host
memory, so PyTorch here is the CPU build standing in for CUDA (`device_torch` patched).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from wide_export.tritonserver import RepoOptions, generate_repository

from tests.triton import fake_pb_utils, tiny_llm
from tests.triton.engine_manifest import write_engine_folder
from tests.triton.support import drive_staggered, load_generation_module

ort = pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")


def _repository(tmp_path, options=None):
    """A tensorrt-flavour repository generated from a stand-in engine folder: (version folder, its model.py)."""
    write_engine_folder(tmp_path / "engines", layers=tiny_llm.LAYERS, vocab=tiny_llm.VOCAB, kv_type="float32",
                        heads=tiny_llm.KV_HEADS, dim=tiny_llm.HEAD_DIM, max_pos=tiny_llm.MAX_POS)
    kwargs = {} if options is None else {"options": options}
    folder = generate_repository(tmp_path / "repo", engines=tmp_path / "engines", **kwargs) / "wide_llm" / "1"
    return folder, load_generation_module(folder)


@pytest.fixture
def trt(tiny, tmp_path, monkeypatch):
    """(generation module on the fake pb_utils, tensorrt Settings, fake server state)."""
    folder, gm = _repository(tmp_path, RepoOptions(max_batch=4))
    settings = gm.Settings.load(str(folder))
    assert (settings.engine_model, settings.kv_cache_memory) == ("wide_llm_engine", "gpu")
    session = ort.InferenceSession(str(tiny[0] / "model.onnx"))
    fake = fake_pb_utils.install(gm, {"wide_llm_engine": session})
    monkeypatch.setattr(gm, "device_torch", lambda why: torch)  # the fake GPU is host memory
    return gm, settings, fake


def _past_and_present_names(settings):
    past = [n for pair in settings.past_names() for n in pair]
    present = [n for pair in settings.present_names() for n in pair]
    return past, present


def test_decode_steps_hand_the_presents_back_unchanged(trt, tiny, rng):
    gm, settings, fake = trt
    step = gm.bls_step(settings)
    returned = []  # per step: logits handed to the sampler

    def watched(feeds, phase):
        logits, presents = step(feeds, phase)
        returned.append(logits)
        return logits, presents

    rows = [gm.Row(rng.integers(0, tiny_llm.VOCAB, size=n), 6) for n in (3, 7)]
    out = gm.generate(watched, settings, rows)
    for row, got in zip(rows, out):
        np.testing.assert_array_equal(got, tiny_llm.reference_greedy(tiny[1], row.prompt, row.max_new_tokens))
    assert len(fake.calls) == 6
    assert {c.model for c in fake.calls} == {"wide_llm_engine"}  # both phases, one model
    assert all(c.gpu for c in fake.calls)  # every request asked for GPU outputs
    assert fake.gpu_as_numpy == 0  # no GPU tensor was ever asked for a host copy
    past, present = _past_and_present_names(settings)
    for before, after in zip(fake.calls, fake.calls[1:]):
        for p_name, k_name in zip(past, present):
            fed = after.inputs[p_name]
            # the next past is a DLPack rename of the very tensor the engine returned, still "GPU"
            assert fed.origin is before.outputs[k_name] and not fed.is_cpu()
            assert np.shares_memory(np.from_dlpack(fed), np.from_dlpack(before.outputs[k_name]))
    # only the last position's logits reach host memory: [B, 1, V]
    assert all(isinstance(x, np.ndarray) and x.shape == (2, 1, tiny_llm.VOCAB) for x in returned)


def test_inflight_joins_and_leaves_stay_on_the_device(trt, tiny, rng):
    gm, settings, fake = trt
    inflight = gm.load_decoding()
    batch = inflight.Batch(gm.bls_step(settings), settings, gm.choose_tokens, max_rows=4)
    # (step it arrives at, prompt length, new tokens): joins into a running batch, leaves at different steps
    plan = [(0, 3, 7), (1, 6, 3), (2, 2, 5), (4, 9, 4), (5, 1, 2)]
    rows = {i: gm.Row(rng.integers(0, tiny_llm.VOCAB, size=n), m) for i, (_, n, m) in enumerate(plan)}
    done, _, _ = drive_staggered(batch, rows, plan, ticks=30)
    for i, row in rows.items():
        np.testing.assert_array_equal(done[i], tiny_llm.reference_greedy(tiny[1], row.prompt, row.max_new_tokens),
                                      err_msg=f"row {i} {plan[i]}")
    assert fake.gpu_as_numpy == 0
    assert set(batch.rebuilds) == {"dlpack"} and batch.rebuilds["dlpack"] >= 4  # never through numpy
    past, present = _past_and_present_names(settings)
    rebuilt = unchanged = 0
    for before, after in zip(fake.calls, fake.calls[1:]):
        if after.inputs[past[0]].shape()[2] == 0:
            continue  # a prefill
        for p_name in past:
            fed = after.inputs[p_name]
            assert not fed.is_cpu()
            if isinstance(fed.origin, torch.Tensor):  # the batch changed: rebuilt by torch from DLPack views
                rebuilt += 1
            else:  # nobody joined or left: the very tensor the previous call returned
                assert fed.origin is before.outputs[present[past.index(p_name)]]
                unchanged += 1
    assert rebuilt and unchanged


def test_cpu_memory_keeps_the_numpy_path(trt, tiny, rng):
    gm, settings, fake = trt
    settings.kv_cache_memory = "cpu"
    rows = [gm.Row(rng.integers(0, tiny_llm.VOCAB, size=4), 3)]
    out = gm.generate(gm.bls_step(settings), settings, rows)
    np.testing.assert_array_equal(out[0], tiny_llm.reference_greedy(tiny[1], rows[0].prompt, 3))
    assert not any(c.gpu for c in fake.calls) and fake.from_dlpack == 0


def test_gpu_memory_without_cuda_torch_refuses_to_load(tmp_path, tiny):
    folder, gm = _repository(tmp_path)
    fake_pb_utils.install(gm, {})
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the refusal needs a server without it")
    with pytest.raises(RuntimeError, match=r"needs PyTorch with CUDA .*pip install torch"):
        gm.bls_step(gm.Settings.load(str(folder)))


def test_settings_of_older_repositories_and_bad_ones(tmp_path, tiny):
    folder, gm = _repository(tmp_path)
    path = folder / "generation.json"
    current = json.loads(path.read_text())
    old = {k: v for k, v in current.items() if k not in ("engine_model", "kv_cache_memory")}
    path.write_text(json.dumps({**old, "prefill_model": "wide_llm_prefill", "decode_model": "wide_llm_decode"}))
    s = gm.Settings.load(str(folder))  # a repository written before engine_model
    assert (s.model_for("prefill"), s.model_for("decode")) == ("wide_llm_prefill", "wide_llm_decode")
    for bad, message in (({**current, "prefil_model": "x"}, "unknown settings"),
                         ({**current, "kv_cache_memory": "host"}, "kv_cache_memory"),
                         (old, "needs engine_model")):
        path.write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=message):
            gm.Settings.load(str(folder))
