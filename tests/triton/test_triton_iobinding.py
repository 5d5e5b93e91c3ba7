"""The onnxruntime flavour's step keeps the KV cache in ONNX Runtime (IOBinding):
presents come back as OrtValues on the execution provider's device and go in as
the next step's past unchanged; only ids / mask / positions go in and logits come
out through host memory. Tokens still equal the numpy full-recompute reference.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.triton import tiny_llm

ort = pytest.importorskip("onnxruntime")


def _watched_generation(gm, tiny_repo, tiny):
    folder = str(tiny_repo / "wide_llm" / "1")
    settings = gm.Settings.load(folder)
    step = gm.ort_step(folder, settings)
    seen = []  # per step: (phase, host bytes in, past feeds, presents out, logits)

    def watched(feeds, phase):
        past_names = {n for pair in settings.past_names() for n in pair}
        host_in = sum(v.nbytes for n, v in feeds.items() if n not in past_names)
        past = [feeds[n] for n in past_names]
        logits, presents = step(feeds, phase)
        seen.append((phase, host_in, past, [x for pair in presents for x in pair], logits))
        return logits, presents

    rng = np.random.default_rng(4)
    rows = [gm.Row(rng.integers(0, tiny_llm.VOCAB, size=n), 6) for n in (3, 7)]
    out = gm.generate(watched, settings, rows)
    for row, got in zip(rows, out):
        np.testing.assert_array_equal(got, tiny_llm.reference_greedy(tiny[1], row.prompt, row.max_new_tokens))
    return seen, len(rows)


def test_presents_stay_in_onnxruntime_and_feed_the_next_step(gm, tiny_repo, tiny):
    seen, batch = _watched_generation(gm, tiny_repo, tiny)
    assert [phase for phase, *_ in seen] == ["prefill"] + ["decode"] * 5
    for phase, host_in, past, presents, logits in seen:
        assert all(isinstance(p, ort.OrtValue) for p in presents)  # never turned into numpy
        assert isinstance(logits, np.ndarray) and logits.shape[:2] == (batch, 7 if phase == "prefill" else 1)
    for (_, _, _, presents, _), (_, _, past, _, _) in zip(seen, seen[1:]):
        # the next step's past is the very OrtValues the previous step returned
        assert {id(p) for p in past} == {id(p) for p in presents}
    # host -> device per decode step: input_ids [B,1] + attention_mask [B,T] + position_ids [B,1], int64
    for s, (phase, host_in, *_rest) in enumerate(seen[1:], start=1):
        total = 7 + s
        assert host_in == 8 * batch * (1 + total + 1)


@pytest.mark.gpu
def test_presents_stay_on_the_gpu_with_the_cuda_ep(gm, tiny_repo, tiny):
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("onnxruntime has no CUDA execution provider here")
    seen, _ = _watched_generation(gm, tiny_repo, tiny)
    for _, _, _, presents, _ in seen:
        assert all(p.device_name().lower() == "cuda" for p in presents)
