"""Serving behaviours pinned by what a client sees, each shown failing with the code broken:

- the in-flight batch reaches exactly its configured size (max_batch_size rows decode together, not one
  fewer) -- broken by `fits` comparing with `<` instead of `<=`;
- a prompt longer than the TensorRT flavour's prefill profile (Settings.max_prompt_tokens) is refused up
  front with its message, alone, and one at the limit is served -- broken by dropping the check in
  validate_row, and by `>=` for `>`;
- a streaming client that the server reports as cancelled (`is_cancelled()`) gets no more tokens, stops
  being decoded and frees its batch slot for a waiting request -- broken by `_send` ignoring
  `is_cancelled()`.

The generated model.py runs outside Triton (fake pb_utils, fake response senders) on the tiny contract
model in ONNX Runtime. No timing assumptions: every wait is on a condition (an Event set by the final
response), bounded by WAIT_S only so that a broken scheduler fails instead of hanging.
"""

from __future__ import annotations

import dataclasses
import threading
from types import SimpleNamespace

import numpy as np
import pytest

from tests.triton import fake_pb_utils, tiny_llm

WAIT_S = 120.0  # a bound for a hung scheduler, not a timing expectation
FINAL = 1  # TRITONSERVER_RESPONSE_COMPLETE_FINAL


class Counting:
    """A step that records (phase, rows, width) of every graph call before running the real one."""

    def __init__(self, step, gate: threading.Event | None = None):
        self.step, self.calls, self.gate = step, [], gate
        self.entered = threading.Event()  # set when the first graph call starts

    def __call__(self, feeds, phase):
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(WAIT_S), "the test never opened the gate"
        mask = feeds["attention_mask"]
        self.calls.append((phase, mask.shape[0], mask.shape[1]))
        return self.step(feeds, phase)

    def rows(self, phase: str) -> list[int]:
        return [n for p, n, _ in self.calls if p == phase]


# ---------------------------------------------------------------------------------------------------
# (a) the in-flight batch reaches exactly max_batch_size rows


class Client:
    def __init__(self):
        self.tokens, self.final, self.done = [], [], threading.Event()

    def emit(self, fresh) -> bool:
        self.tokens.append(list(fresh))
        return True

    def finish(self, error) -> None:
        self.final.append(error)
        self.done.set()


def _job(inflight, gm, client, prompt, new, rows=1):
    return inflight.Job(rows=[gm.Row(np.asarray(prompt), new) for _ in range(rows)], emit=client.emit,
                        finish=client.finish)


@pytest.mark.parametrize("max_rows", [1, 3, 4])
def test_the_batch_fills_to_exactly_max_batch_size(gm, inflight, runner, rng, max_rows):
    """max_rows + 2 one-row jobs wait before the scheduler starts: the first prefill takes exactly
    max_rows of them and that many rows decode together; the two left over join as the first rows
    leave, and the batch never holds more than max_rows."""
    settings, ort = runner
    step = Counting(ort)
    batch = inflight.Batch(step, settings, gm.choose_tokens, max_rows=max_rows)
    sched = inflight.Scheduler(batch)
    clients = [Client() for _ in range(max_rows + 2)]
    for i, c in enumerate(clients):  # the first max_rows finish early, the rest run longer
        sched.submit(_job(inflight, gm, c, rng.integers(0, tiny_llm.VOCAB, size=3), 4 if i < max_rows else 6))
    sched.start()
    try:
        for c in clients:
            assert c.done.wait(WAIT_S)
    finally:
        sched.stop()
    assert all(c.final == [None] for c in clients)
    assert step.rows("prefill")[0] == max_rows  # the first admission fills the batch
    assert step.rows("decode")[0] == max_rows  # ... and that many rows decode together
    assert max(step.rows("decode")) == max_rows == sched.max_rows_seen
    assert sum(step.rows("prefill")) == max_rows + 2


def test_rows_joining_a_running_batch_fill_it_exactly(gm, inflight, runner, rng):
    """Jobs submitted while a 2-row request decodes (max_rows=5): the three one-row jobs join the
    running batch up to exactly 5 rows; the fourth waits until a row leaves."""
    settings, ort = runner
    gate = threading.Event()
    step = Counting(ort, gate)
    batch = inflight.Batch(step, settings, gm.choose_tokens, max_rows=5)
    sched = inflight.Scheduler(batch).start()
    first, late = Client(), [Client() for _ in range(4)]
    try:
        sched.submit(_job(inflight, gm, first, rng.integers(0, tiny_llm.VOCAB, size=4), 8, rows=2))
        # The scheduler is blocked inside its first step (the gate): the others queue behind it.
        assert step.entered.wait(WAIT_S)
        for c in late:
            sched.submit(_job(inflight, gm, c, rng.integers(0, tiny_llm.VOCAB, size=2), 3))
        gate.set()
        for c in [first, *late]:
            assert c.done.wait(WAIT_S)
    finally:
        gate.set()
        sched.stop()
    phases = [(p, n) for p, n, _ in step.calls]
    # prefill and first decode of the 2-row request; all four late jobs were waiting at the next look
    # (the gate held the first step), and exactly three of them fit
    assert phases[:4] == [("prefill", 2), ("decode", 2), ("prefill", 3), ("decode", 5)], phases
    assert sched.max_rows_seen == 5 and max(step.rows("decode")) == 5


def test_fits_counts_rows_up_to_and_including_the_limit(gm, inflight, runner):
    settings, ort = runner
    batch = inflight.Batch(ort, settings, gm.choose_tokens, max_rows=4)
    row = gm.Row(np.array([1, 2]), 2)
    assert batch.fits([row] * 4) and not batch.fits([row] * 5)
    batch.prefill([row, row, row])
    assert batch.fits([row]) and not batch.fits([row, row])


# ---------------------------------------------------------------------------------------------------
# Triton requests through TritonPythonModel (fake pb_utils, fake senders)


class Sender:
    """A decoupled response sender; `cancel_after`: is_cancelled() turns true after that many token
    responses (what Triton reports once the client cancelled or disconnected)."""

    def __init__(self, cancel_after: int | None = None):
        self.cancel_after = cancel_after
        self.responses: list = []  # responses with tensors or an error, in order
        self.flags: list[int] = []
        self.done = threading.Event()
        self.cancelled_polls = 0

    def is_cancelled(self) -> bool:
        cancelled = self.cancel_after is not None and len(self.responses) >= self.cancel_after
        self.cancelled_polls += cancelled
        return cancelled

    def send(self, response=None, flags: int = 0) -> None:
        if response is not None:
            self.responses.append(response)
        self.flags.append(flags)
        if flags & FINAL:
            self.done.set()

    @property
    def tokens(self) -> list[int]:
        return [int(_tensor(r, "output_ids")[0, 0]) for r in self.responses if not r.has_error()]

    @property
    def errors(self) -> list[str]:
        return [r.error().message() for r in self.responses if r.has_error()]


def _tensor(response, name):
    return next(t for t in response.output_tensors if t.name() == name).as_numpy()


class Request:
    def __init__(self, prompt, new: int, sender: Sender):
        self.inputs = {"input_ids": fake_pb_utils.Tensor("input_ids", np.asarray(prompt, np.int64).reshape(1, -1)),
                       "max_new_tokens": fake_pb_utils.Tensor("max_new_tokens", np.full((1, 1), new, np.int32))}
        self.sender = sender

    def get_response_sender(self):
        return self.sender

    def requested_output_names(self):
        return ["output_ids", "finish_reason"]


def _pb_utils() -> SimpleNamespace:
    return SimpleNamespace(
        Tensor=fake_pb_utils.Tensor, TritonError=fake_pb_utils.TritonError,
        InferenceResponse=fake_pb_utils.InferenceResponse, TRITONSERVER_RESPONSE_COMPLETE_FINAL=FINAL,
        get_input_tensor_by_name=lambda request, name: request.inputs.get(name), Logger=None)


@pytest.fixture
def model_for(gm, runner, monkeypatch):
    """fn(settings changes, max_rows, step) -> (TritonPythonModel set up as initialize() would for an
    in-flight streaming repository, its counting step)."""
    metrics = gm.load_sibling("metrics")
    monkeypatch.setattr(gm, "pb_utils", _pb_utils())
    made = []

    def make(max_rows: int = 8, gate: threading.Event | None = None, **changes):
        settings, ort = runner
        model = gm.TritonPythonModel()
        model.settings = dataclasses.replace(settings, **changes)
        model.codec, model.streaming = None, True
        model.metrics = metrics.Metrics(None, "wide_llm")
        model.timer = lambda *request: metrics.RequestTimer(model.metrics)  # (request) in newer model.py
        model.step = Counting(ort, gate)
        batch = gm.load_decoding().Batch(model.step, model.settings, gm.choose_tokens, max_rows)
        model.scheduler = gm.load_decoding().Scheduler(batch).start()
        made.append(model)
        return model

    yield make
    for model in made:
        model.finalize()


# ---------------------------------------------------------------------------------------------------
# (b) the TensorRT flavour's prefill profile bounds the prompt


def test_a_prompt_beyond_the_prefill_profile_is_refused_alone_and_one_at_the_limit_is_served(
        gm, model_for, tiny, rng):
    limit = 8
    model = model_for(flavour="tensorrt", engine_model="wide_llm_engine", max_prompt_tokens=limit)
    prompts = {"at": rng.integers(0, tiny_llm.VOCAB, size=limit),
               "over": rng.integers(0, tiny_llm.VOCAB, size=limit + 1),
               "short": rng.integers(0, tiny_llm.VOCAB, size=3)}
    senders = {k: Sender() for k in prompts}
    # one execute() with all three, as Triton hands a batch of requests over
    model.execute([Request(p, 4, senders[k]) for k, p in prompts.items()])
    for s in senders.values():
        assert s.done.wait(WAIT_S)
    over = senders["over"]
    assert over.errors == [f"prompt has {limit + 1} tokens, the engine's prefill allows {limit}"]
    assert len(over.responses) == 1 and over.flags == [FINAL]  # refused up front: one final error
    # the engine never saw it: no prefill wider than the profile
    assert max(width for phase, _, width in model.step.calls if phase == "prefill") == limit
    for k in ("at", "short"):
        assert senders[k].errors == [] and senders[k].flags[-1] == FINAL
        np.testing.assert_array_equal(senders[k].tokens, tiny_llm.reference_greedy(tiny[1], prompts[k], 4))


@pytest.mark.parametrize("size, refused", [(7, False), (8, False), (9, True), (20, True)])
def test_validate_row_bounds_the_prompt_by_the_prefill_profile(gm, runner, size, refused):
    settings = dataclasses.replace(runner[0], flavour="tensorrt", engine_model="e", max_prompt_tokens=8)
    row = gm.Row(np.ones(size, np.int64), 2)
    if refused:
        with pytest.raises(gm.RequestError) as err:
            gm.validate_row(row, settings)
        said = str(err.value)
        assert said.startswith(f"prompt has {size} tokens") and said.endswith(" 8"), said  # the prefill's limit
    else:
        gm.validate_row(row, settings)
    gm.validate_row(row, dataclasses.replace(settings, max_prompt_tokens=0))  # 0: no prefill bound


# ---------------------------------------------------------------------------------------------------
# (c) a cancelled streaming client stops being decoded and frees its slot


def test_a_cancelled_stream_stops_decoding_and_its_slot_goes_to_a_waiting_request(gm, model_for, tiny, rng):
    """max_batch_size 1: a stream that the server reports cancelled after 3 tokens (of 40) gets no
    fourth token, only its final flag; its row leaves, and the request waiting behind it (no slot
    free until then) is admitted and streams its reference tokens."""
    gate = threading.Event()
    model = model_for(max_rows=1, gate=gate)
    long_prompt, waiting_prompt = rng.integers(0, tiny_llm.VOCAB, size=4), rng.integers(0, tiny_llm.VOCAB, size=5)
    cancelled, waiting = Sender(cancel_after=3), Sender()
    model.execute([Request(long_prompt, 40, cancelled)])
    assert model.step.entered.wait(WAIT_S)
    model.execute([Request(waiting_prompt, 6, waiting)])  # queued behind it: the gate holds the first step
    gate.set()
    assert cancelled.done.wait(WAIT_S) and waiting.done.wait(WAIT_S)
    assert len(cancelled.tokens) == 3 and cancelled.errors == [] and cancelled.flags[-1] == FINAL
    np.testing.assert_array_equal(cancelled.tokens, tiny_llm.reference_greedy(tiny[1], long_prompt, 3))
    # Decoded while it streamed and one step more (the step whose token found it cancelled), then gone:
    # its row took 4 graph calls, not 40.
    prefills = [c for c in model.step.calls if c[0] == "prefill"]
    assert [c[1] for c in prefills] == [1, 1]  # one slot: the waiting request was prefilled after it left
    first_waiting = model.step.calls.index(prefills[1])
    assert first_waiting == 4, model.step.calls  # prefill + 3 decodes of the cancelled one, then its slot is free
    assert waiting.errors == [] and waiting.flags[-1] == FINAL
    np.testing.assert_array_equal(waiting.tokens, tiny_llm.reference_greedy(tiny[1], waiting_prompt, 6))
    assert len(model.step.calls) == 4 + 6  # nobody decoded the cancelled row on to 40 tokens


def test_send_says_a_cancelled_client_is_gone_but_still_delivers_its_final_flag(gm, monkeypatch):
    monkeypatch.setattr(gm, "pb_utils", _pb_utils())
    sender = Sender(cancel_after=0)
    response = fake_pb_utils.InferenceResponse([])
    assert gm._send(sender, response) is False and sender.responses == [] and sender.flags == []
    assert gm._send(sender, response, FINAL, even_if_cancelled=True) is True
    assert sender.responses == [] and sender.flags == [FINAL]  # the final flag alone, no tokens
    live = Sender()
    assert gm._send(live, response) is True and live.responses == [response]
