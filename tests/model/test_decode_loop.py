"""decoding.decode_loop, the one generation loop in lock-step, with a step that records what it is fed and whose next
token is known by hand: the ids, the mask over past + new positions and the positions of each step (left
padding included), the chosen tokens, the callback and the early stop."""

from __future__ import annotations

import numpy as np
import pytest

from wide_export.generation.decoding import Batch, PositionalFeeds, Prompt, decode_loop


class CountingStep:
    """logits whose argmax is (last id + row + 1) % V; records each feed."""

    V = 50

    def __init__(self):
        self.fed = []

    def __call__(self, ids, mask, pos):
        self.fed.append((ids.copy(), mask.copy(), pos.copy()))
        logits = np.zeros((*ids.shape, self.V), np.float32)
        for b in range(ids.shape[0]):
            logits[b, -1, (ids[b, -1] + b + 1) % self.V] = 1.0
        return logits


def test_feeds_tokens_and_callback_by_hand():
    step, seen = CountingStep(), []
    ids = np.array([[0, 7, 8], [3, 4, 5]])
    mask = np.array([[0, 1, 1], [1, 1, 1]])  # row 0 left-padded by one
    new = decode_loop(step, ids, mask, 3, on_token=lambda k, chosen: seen.append((k, chosen.tolist())))
    assert new.tolist() == [[9, 10, 11], [7, 9, 11]]
    assert seen == [(0, [9, 7]), (1, [10, 9]), (2, [11, 11])]
    (i0, m0, p0), (i1, m1, p1), (i2, m2, p2) = step.fed
    assert i0.tolist() == ids.tolist() and m0.tolist() == mask.tolist() and p0.tolist() == [[0, 0, 1], [0, 1, 2]]
    assert i1.tolist() == [[9], [7]] and m1.tolist() == [[0, 1, 1, 1], [1, 1, 1, 1]] and p1.tolist() == [[2], [3]]
    assert i2.tolist() == [[10], [9]] and m2.shape == (2, 5) and p2.tolist() == [[3], [4]]


def test_stop_ends_after_the_token_that_asked_and_zero_tokens_is_empty():
    step = CountingStep()
    new = decode_loop(step, np.array([[1]]), None, 10, stop=lambda chosen: int(chosen[0]) == 4)
    assert new.tolist() == [[2, 3, 4]] and len(step.fed) == 3
    assert decode_loop(CountingStep(), np.array([[1], [2]]), None, 0).shape == (2, 0)


def test_a_mask_that_is_not_left_padding_is_refused_before_any_step():
    step = CountingStep()
    for mask in ([[1, 1, 0]], [[0, 1, 0]], [[0, 0, 0]], [[0, 1, 2]]):
        with pytest.raises(ValueError, match="^row 0 .*left padding"):
            decode_loop(step, np.array([[1, 2, 3]]), np.array(mask), 2)
    assert step.fed == []


class Boom(Exception):
    pass


def test_an_error_in_the_step_or_a_callback_is_raised_to_the_caller():
    class FailsSecond(CountingStep):
        def __call__(self, ids, mask, pos):
            if len(self.fed) == 1:
                raise Boom("the second step failed")
            return super().__call__(ids, mask, pos)

    with pytest.raises(Boom, match="the second step failed"):
        decode_loop(FailsSecond(), np.array([[1]]), None, 5)

    def on_token(k, chosen):
        raise Boom("the callback failed")

    with pytest.raises(Boom, match="the callback failed"):
        decode_loop(CountingStep(), np.array([[1]]), None, 5, on_token=on_token)


def test_rows_cannot_join_a_batch_whose_step_keeps_its_own_cache():
    step = CountingStep()
    batch = Batch(lambda feeds, phase: (step(*feeds), []), PositionalFeeds(),
                  lambda logits, rows, rngs: logits.argmax(-1), 4)
    batch.prefill([Prompt(np.array([1, 2]), 3)])
    with pytest.raises(ValueError, match="keeps its own KV cache"):
        batch.prefill([Prompt(np.array([5]), 3)])


class Recorder:
    """A step with its cache handed back (numpy, [B, 1, W, 1]) so rows can join; records each step's feeds."""

    def __init__(self):
        self.fed = []

    @staticmethod
    def feeds(ids, mask, positions, past):
        return ids, mask, positions, past

    def __call__(self, feeds, phase):
        ids, mask, positions, past = feeds
        self.fed.append((ids.copy(), mask.copy(), positions.copy()))
        new = np.zeros((ids.shape[0], 1, ids.shape[1], 1), np.float32)
        cache = [(new, new)] if past is None else [tuple(np.concatenate([t, new], axis=2) for t in past[0])]
        logits = np.zeros((*ids.shape, CountingStep.V), np.float32)
        logits[:, -1, 1] = 1.0
        return logits, cache


def _batch(step):
    return Batch(step, step, lambda logits, rows, rngs: logits.argmax(-1), 8)


def test_each_row_is_padded_with_its_own_ids_and_a_request_row_with_zeros():
    from wide_export.generation.rows import Row

    step = Recorder()
    _batch(step).prefill([Prompt(np.array([5, 6, 7, 8]), 2),
                          Prompt(np.array([9]), 2, padding=np.array([40, 41, 42, 43, 44])),  # more than needed
                          Prompt(np.array([9, 9]), 2, padding=np.array([33])),  # fewer than needed
                          Row(np.array([3, 4]), 2)])
    ids, mask, _ = step.fed[0]
    assert ids.tolist() == [[5, 6, 7, 8], [42, 43, 44, 9], [0, 33, 9, 9], [0, 0, 3, 4]]
    assert mask.tolist() == [[1, 1, 1, 1], [0, 0, 0, 1], [0, 0, 1, 1], [0, 0, 1, 1]]


def test_decode_positions_count_each_rows_tokens_through_joins_and_leaves():
    step = Recorder()
    batch = _batch(step)
    expected = []

    def decode():
        expected.append([[a.row.prompt.size + len(a.tokens) - 1] for a in batch.rows])  # by hand, per row
        batch.decode()

    first = batch.prefill([Prompt(np.arange(3), 9), Prompt(np.arange(1), 9)])
    decode()
    decode()
    batch.prefill([Prompt(np.arange(5), 9)])
    decode()
    batch.leave(first[:1])
    decode()
    batch.prefill([Prompt(np.arange(2), 9), Prompt(np.arange(6), 9)])
    decode()
    batch.leave(list(batch.rows))
    batch.prefill([Prompt(np.arange(4), 9)])
    decode()
    fed = [positions.tolist() for ids, mask, positions in step.fed if ids.shape[1] == 1]
    assert fed == expected
    assert [p[0] for p in expected] == [[3], [4], [5], [4], [5], [4]]  # the first row's count, by hand
