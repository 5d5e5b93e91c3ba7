"""The generated model.py outside Triton: decode loop vs a numpy full-recompute reference,
request validation, sampling."""

from __future__ import annotations

import numpy as np
import pytest

from tests.triton import tiny_llm


def test_batched_left_padded_greedy_matches_full_recompute(gm, runner, tiny, rng):
    settings, step = runner
    lengths = rng.permutation([1, 3, 6, 9])  # different lengths: left padding is exercised
    news = rng.integers(1, 8, size=4)
    rows = [gm.Row(rng.integers(0, tiny_llm.VOCAB, size=n), int(m)) for n, m in zip(lengths, news)]
    out = gm.generate(step, settings, rows)
    for row, got in zip(rows, out):
        want = tiny_llm.reference_greedy(tiny[1], row.prompt, row.max_new_tokens)
        np.testing.assert_array_equal(got, want)


def test_rows_too_long_to_pad_together_are_split(gm, runner, tiny, rng):
    settings, step = runner
    widths = []

    def watched(feeds, phase):
        widths.append(feeds["attention_mask"].shape[1])
        return step(feeds, phase)

    # Each row fits the limit alone; padded into one batch they would not.
    shapes = [(tiny_llm.MAX_POS - 2, 2), (2, tiny_llm.MAX_POS - 3), (3, 4)]
    rows = [gm.Row(rng.integers(0, tiny_llm.VOCAB, size=n), m) for n, m in shapes]
    out = gm.generate_all(watched, settings, rows)
    assert max(widths) <= tiny_llm.MAX_POS
    for row, got in zip(rows, out):
        np.testing.assert_array_equal(got, tiny_llm.reference_greedy(tiny[1], row.prompt, row.max_new_tokens))


@pytest.mark.parametrize(
    "prompt_len, new, extra, message",
    [
        (0, 4, {}, "empty"),
        (5, 0, {}, "max_new_tokens"),
        (5, -3, {}, "max_new_tokens"),
        (tiny_llm.MAX_POS, 1, {}, "exceeds"),
        (5, 4, {"temperature": -1.0}, "temperature"),
        (5, 4, {"top_p": 0.0}, "top_p"),
        (5, 4, {"top_p": 1.5}, "top_p"),
    ],
)
def test_validation_rejects(gm, runner, prompt_len, new, extra, message, rng):
    settings, _ = runner
    row = gm.Row(rng.integers(0, tiny_llm.VOCAB, size=prompt_len), new, **extra)
    with pytest.raises(gm.RequestError, match=message):
        gm.validate_row(row, settings)


@pytest.mark.parametrize("bad", [-1, tiny_llm.VOCAB])
def test_validation_rejects_out_of_vocab(gm, runner, bad, rng):
    settings, _ = runner
    prompt = rng.integers(0, tiny_llm.VOCAB, size=4)
    prompt[2] = bad
    with pytest.raises(gm.RequestError, match="input_ids must lie"):
        gm.validate_row(gm.Row(prompt, 2), settings)


def test_validation_accepts_the_limit(gm, runner):
    settings, _ = runner
    gm.validate_row(gm.Row(np.zeros(tiny_llm.MAX_POS - 3, np.int64) + 1, 3), settings)


def test_sampling_is_seeded_and_tiny_top_p_is_greedy(gm, runner, rng):
    settings, step = runner
    prompt = rng.integers(0, tiny_llm.VOCAB, size=5)
    greedy = gm.generate(step, settings, [gm.Row(prompt, 12)])[0]
    hot = [gm.Row(prompt, 12, temperature=5.0, seed=s) for s in (7, 7, 8)]
    a, b, c = gm.generate(step, settings, hot)
    np.testing.assert_array_equal(a, b)  # same seed, same tokens (even in one batch)
    assert not np.array_equal(a, c) or not np.array_equal(a, greedy)  # a high temperature does sample
    nucleus = gm.generate(step, settings, [gm.Row(prompt, 12, temperature=1.0, top_p=1e-6, seed=3)])[0]
    np.testing.assert_array_equal(nucleus, greedy)  # top_p -> 0 keeps only the argmax


def test_choose_tokens_top_p_keeps_the_nucleus(gm):
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]]))
    seen = set()
    rngs = [np.random.default_rng(s) for s in range(1)]
    for _ in range(300):
        seen.add(int(gm.choose_tokens(logits, [gm.Row(np.ones(1), 1, temperature=1.0, top_p=0.7)], rngs)[0]))
    assert seen == {0, 1}  # 0.5 < 0.7 <= 0.8: the two most likely tokens only
