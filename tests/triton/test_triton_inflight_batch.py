"""In-flight batching without a server: the generated repository's generation/decoding.py drives the
tiny contract model through ONNX Runtime; rows join a running batch (left-padded to a
common width) and leave it, and every row's greedy tokens equal the numpy full-recompute
reference of that prompt alone. Every wait is bounded.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from tests.triton import tiny_llm
from tests.triton.support import drive_staggered

WAIT_S = 60.0


def _host_step(step):
    """The same step with numpy presents (as the tensorrt flavour's BLS step returns)."""
    def run(feeds, phase):
        logits, presents = step(feeds, phase)
        return logits, [(k.numpy(), v.numpy()) for k, v in presents]
    return run


def _row(gm, rng, prompt_len: int, new: int):
    return gm.Row(rng.integers(0, tiny_llm.VOCAB, size=prompt_len), new)


@pytest.mark.parametrize("cache", ["ortvalue", "numpy", "ortvalue-dlpack"])
def test_rows_joining_and_leaving_a_running_batch_match_the_reference(gm, inflight, runner, tiny, rng, cache):
    """ortvalue / numpy: presents in host memory, rebuilt with numpy. ortvalue-dlpack: the device
    path (PyTorch over DLPack, what CUDA OrtValues get) forced on CPU OrtValues; the rebuilt
    torch tensors are bound to ONNX Runtime by pointer."""
    settings, step = runner
    ops = None
    if cache == "ortvalue-dlpack":
        pytest.importorskip("torch")
        ops = inflight.TorchCacheOps()
    batch = inflight.Batch(_host_step(step) if cache == "numpy" else step, settings, gm.choose_tokens,
                           max_rows=8, ops=ops)
    # (step at which it arrives, prompt length, new tokens): joins with shorter and longer
    # prompts than the batch's width, rows leaving at different steps, a 1-token row.
    plan = [(0, 3, 9), (0, 7, 4), (2, 12, 6), (3, 1, 5), (5, 5, 1), (6, 20, 2), (9, 2, 3)]
    rows = {i: _row(gm, rng, n, m) for i, (_, n, m) in enumerate(plan)}
    done, widths, joined_running = drive_staggered(batch, rows, plan, ticks=40)
    assert len(done) == len(plan) and not batch.rows
    assert joined_running >= 4  # most rows joined while others were decoding
    assert any(b < a for a, b in zip(widths, widths[1:]))  # leaving rows cut shared padding
    # CUDA OrtValues (a GPU machine) are rebuilt on the device even without forced ops
    on_device = cache == "ortvalue" and getattr(step, "device", "cpu") != "cpu"
    assert set(batch.rebuilds) == {"dlpack" if ops or on_device else "numpy"}
    for i, row in rows.items():
        np.testing.assert_array_equal(done[i], tiny_llm.reference_greedy(tiny[1], row.prompt, row.max_new_tokens),
                                      err_msg=f"row {i} {plan[i]}")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_dlpack_cache_ops_equal_the_numpy_ones(inflight, rng, device):
    """join (left-pad to a width, rows of old then new) and keep (rows, columns from start) give the
    numpy results exactly, on the tensors' own device, contiguous (bound by pointer next)."""
    torch = pytest.importorskip("torch")
    ops, ref = inflight.TorchCacheOps(), inflight.NumpyCacheOps()
    old = rng.normal(size=(2, 3, 5, 4)).astype(np.float16)
    new = rng.normal(size=(3, 3, 2, 4)).astype(np.float16)
    joined = ops.join(torch.from_numpy(old).to(device), torch.from_numpy(new).to(device), 7)
    assert joined.device.type == device and joined.is_contiguous()
    np.testing.assert_array_equal(joined.cpu().numpy(), ref.join(old, new, 7))
    kept = ops.keep(joined, [0, 3, 4], 2)
    assert kept.device.type == device and kept.is_contiguous()
    np.testing.assert_array_equal(kept.cpu().numpy(), ref.keep(ref.join(old, new, 7), [0, 3, 4], 2))
    assert inflight.in_host_memory(joined) == (device == "cpu")


def test_cache_ops_follow_where_the_cache_lies(inflight):
    ort = pytest.importorskip("onnxruntime")
    host = np.zeros((1, 1, 1, 1), np.float32)
    assert inflight.cache_ops(host).name == "numpy"
    assert inflight.cache_ops(ort.OrtValue.ortvalue_from_numpy(host)).name == "numpy"

    class GpuTensor:  # what pb_utils.Tensor says of GPU memory
        def is_cpu(self):
            return False

    pytest.importorskip("torch")
    assert inflight.cache_ops(GpuTensor()).name == "dlpack"


def test_device_cache_without_torch_says_what_to_install(inflight, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    with pytest.raises(RuntimeError, match=r"needs PyTorch .*pip install torch"):
        inflight.TorchCacheOps()


class Recorder:
    """A job's client: collects streamed tokens; optionally walks away after `leave_after`."""

    def __init__(self, leave_after: int | None = None):
        self.tokens: list[np.ndarray] = []
        self.final: list = []
        self.leave_after = leave_after
        self.done = threading.Event()
        self.finished_at = 0.0

    def emit(self, tokens: np.ndarray) -> bool:
        if self.leave_after is not None and len(self.tokens) >= self.leave_after:
            return False
        self.tokens.append(np.array(tokens))
        return True

    def finish(self, error) -> None:
        self.final.append(error)
        self.finished_at = time.monotonic()
        self.done.set()

    def job(self, inflight, rows):
        return inflight.Job(rows=rows, emit=self.emit, finish=self.finish)


def _scheduler(gm, inflight, runner, max_rows=8, step=None, logs=None, start=True):
    settings, ort = runner
    batch = inflight.Batch(step or ort, settings, gm.choose_tokens, max_rows=max_rows)
    sched = inflight.Scheduler(batch, (logs.append if logs is not None else (lambda m: None)))
    return sched.start() if start else sched


def _slowed(step, seconds: float):
    """`step`, taking at least `seconds` (the tiny model is too quick for requests to overlap)."""
    def run(feeds, phase):
        time.sleep(seconds)
        return step(feeds, phase)
    return run


def test_staggered_jobs_from_16_threads_stream_the_reference_tokens(gm, inflight, runner, tiny, rng):
    sched = _scheduler(gm, inflight, runner, max_rows=6, step=_slowed(runner[1], 0.005))
    jobs = [(_row(gm, rng, int(rng.integers(1, 14)), int(rng.integers(1, 12))), float(rng.uniform(0, 0.05)))
            for _ in range(16)]
    clients = [Recorder() for _ in jobs]

    def submit(i: int) -> None:
        time.sleep(jobs[i][1] + 0.01 * i)
        sched.submit(clients[i].job(inflight, [jobs[i][0]]))

    threads = [threading.Thread(target=submit, args=(i,), daemon=True) for i in range(len(jobs))]
    try:
        for t in threads:
            t.start()
        for c in clients:
            assert c.done.wait(WAIT_S), "a job never finished"
    finally:
        sched.stop()
    assert sched.max_rows_seen > 1 and sched.batch.max_rows >= sched.max_rows_seen
    for (row, _), c in zip(jobs, clients):
        assert c.final == [None]  # exactly one final response, no error
        got = np.concatenate(c.tokens)
        np.testing.assert_array_equal(got, tiny_llm.reference_greedy(tiny[1], row.prompt, row.max_new_tokens))


def test_a_short_job_arriving_during_a_long_one_finishes_first(gm, inflight, runner, tiny, rng):
    slow = []

    def step(feeds, phase):  # slow steps, so the long job is surely still decoding
        time.sleep(0.01)
        slow.append(feeds["input_ids"].shape[0])
        return runner[1](feeds, phase)

    sched = _scheduler(gm, inflight, runner, step=step)
    long_row, short_row = _row(gm, rng, 4, tiny_llm.MAX_POS - 4), _row(gm, rng, 9, 3)
    long_client, short_client = Recorder(), Recorder()
    try:
        sched.submit(long_client.job(inflight, [long_row]))
        deadline = time.monotonic() + WAIT_S
        while len(long_client.tokens) < 5 and time.monotonic() < deadline:
            time.sleep(0.005)
        sched.submit(short_client.job(inflight, [short_row]))
        assert short_client.done.wait(WAIT_S) and long_client.done.wait(WAIT_S)
    finally:
        sched.stop()
    assert short_client.finished_at < long_client.finished_at
    assert 2 in slow  # the two decoded in one batch
    for row, c in ((long_row, long_client), (short_row, short_client)):
        np.testing.assert_array_equal(np.concatenate(c.tokens),
                                      tiny_llm.reference_greedy(tiny[1], row.prompt, row.max_new_tokens))


def test_padded_width_stays_within_the_model_limit(gm, inflight, runner, tiny, rng):
    widths = []

    def step(feeds, phase):
        widths.append(feeds["attention_mask"].shape[1])
        return runner[1](feeds, phase)

    sched = _scheduler(gm, inflight, runner, step=step, start=False)
    # each fits alone; their padded width would not, if the first's columns stayed after it left
    rows = [_row(gm, rng, n, m) for n, m in [(tiny_llm.MAX_POS - 2, 2), (2, tiny_llm.MAX_POS - 3), (3, 4)]]
    clients = [Recorder() for _ in rows]
    try:
        for row, c in zip(rows, clients):
            sched.submit(c.job(inflight, [row]))
        sched.start()  # all three are waiting at its first look
        for c in clients:
            assert c.done.wait(WAIT_S)
    finally:
        sched.stop()
    assert max(widths) <= tiny_llm.MAX_POS
    for row, c in zip(rows, clients):
        np.testing.assert_array_equal(np.concatenate(c.tokens),
                                      tiny_llm.reference_greedy(tiny[1], row.prompt, row.max_new_tokens))


def test_a_client_that_leaves_is_dropped_and_the_others_are_exact(gm, inflight, runner, tiny, rng):
    logs: list[str] = []
    calls = []

    def step(feeds, phase):
        calls.append(phase)
        return runner[1](feeds, phase)

    sched = _scheduler(gm, inflight, runner, logs=logs, step=step)
    rows = [_row(gm, rng, 5, 30), _row(gm, rng, 8, 12), _row(gm, rng, 2, 7)]
    clients = [Recorder(leave_after=2), Recorder(), Recorder()]
    try:
        for row, c in zip(rows, clients):
            sched.submit(c.job(inflight, [row]))
        for c in clients:
            assert c.done.wait(WAIT_S)
    finally:
        sched.stop()
    assert len(clients[0].tokens) == 2 and clients[0].final == [None]
    assert any("went away after 2 of 30 tokens" in line for line in logs), logs
    assert len(calls) < 20  # its row left the batch: nobody decoded on to 30 tokens
    for row, c in zip(rows[1:], clients[1:]):
        np.testing.assert_array_equal(np.concatenate(c.tokens),
                                      tiny_llm.reference_greedy(tiny[1], row.prompt, row.max_new_tokens))


def test_batched_rows_of_one_request_stream_together(gm, inflight, runner, tiny, rng):
    sched = _scheduler(gm, inflight, runner)
    prompts = rng.integers(0, tiny_llm.VOCAB, size=(3, 6))
    rows = [gm.Row(p, 5) for p in prompts]
    client = Recorder()
    try:
        sched.submit(client.job(inflight, rows))
        assert client.done.wait(WAIT_S)
    finally:
        sched.stop()
    assert all(t.shape == (3,) for t in client.tokens) and len(client.tokens) == 5
    got = np.stack(client.tokens, axis=1)
    for row, tokens in zip(rows, got):
        np.testing.assert_array_equal(tokens, tiny_llm.reference_greedy(tiny[1], row.prompt, 5))


@pytest.mark.parametrize("fail_at", [1, 3], ids=["prefill", "decode"])
def test_a_failing_step_fails_its_jobs_and_the_scheduler_keeps_serving(gm, inflight, runner, tiny, rng, fail_at):
    calls = []

    def step(feeds, phase):
        calls.append(phase)
        if len(calls) == fail_at:
            raise RuntimeError("device lost")
        return runner[1](feeds, phase)

    sched = _scheduler(gm, inflight, runner, step=step)
    first, second = Recorder(), Recorder()
    row = _row(gm, rng, 4, 6)
    try:
        sched.submit(first.job(inflight, [row]))
        assert first.done.wait(WAIT_S)
        sched.submit(second.job(inflight, [row]))
        assert second.done.wait(WAIT_S)
    finally:
        sched.stop()
    assert len(first.final) == 1 and "device lost" in first.final[0]
    assert calls[fail_at - 1] == ("prefill" if fail_at == 1 else "decode")
    assert second.final == [None]
    np.testing.assert_array_equal(np.concatenate(second.tokens), tiny_llm.reference_greedy(tiny[1], row.prompt, 6))


def test_stop_finishes_every_open_job_once(gm, inflight, runner, rng):
    def step(feeds, phase):
        time.sleep(0.02)
        return runner[1](feeds, phase)

    sched = _scheduler(gm, inflight, runner, max_rows=1, step=step)
    running, waiting = Recorder(), Recorder()
    sched.submit(running.job(inflight, [_row(gm, rng, 3, 50)]))
    sched.submit(waiting.job(inflight, [_row(gm, rng, 3, 50)]))  # max_rows=1: it waits
    deadline = time.monotonic() + WAIT_S
    while not running.tokens and time.monotonic() < deadline:
        time.sleep(0.005)
    sched.stop()
    assert not sched._thread.is_alive()
    for c in (running, waiting):
        assert len(c.final) == 1 and "shutting down" in c.final[0]
    assert not waiting.tokens
    late = Recorder()
    sched.submit(late.job(inflight, [_row(gm, rng, 3, 2)]))
    assert late.final and "shutting down" in late.final[0]


def test_a_row_that_stops_leaves_the_batch_at_once_while_its_request_goes_on(gm, inflight, runner, tiny, rng):
    """A two-row request whose first row hits a stop token at its 3rd token: from the next step
    the graph decodes one row, not two; the other row still gets the reference tokens, and the
    stopped row's later slots are None (padding) in what the client receives."""
    rows_per_step = []

    def step(feeds, phase):
        rows_per_step.append((phase, feeds["input_ids"].shape[0]))
        return runner[1](feeds, phase)

    prompts = [rng.integers(0, tiny_llm.VOCAB, size=5) for _ in range(2)]
    first = tiny_llm.reference_greedy(tiny[1], prompts[0], 10)
    second = tiny_llm.reference_greedy(tiny[1], prompts[1], 10)
    stop = int(first[2])
    assert stop not in first[:2].tolist() and stop not in second.tolist(), "pick another seed"
    rows = [gm.Row(p, 10, stop_ids=(stop,)) for p in prompts]
    outputs = gm.row_outputs(rows)
    client = Recorder()
    job = inflight.Job(rows=rows, emit=client.emit, finish=client.finish, outputs=outputs)
    sched = _scheduler(gm, inflight, runner, step=step)
    try:
        sched.submit(job)
        assert client.done.wait(WAIT_S)
    finally:
        sched.stop()
    assert [o.finish_reason for o in outputs] == ["stop", "length"]
    np.testing.assert_array_equal(outputs[0].tokens, first[:3])
    np.testing.assert_array_equal(outputs[1].tokens, second)
    assert [n for _, n in rows_per_step] == [2, 2, 2] + [1] * 7  # prefill, 2 decodes of both, then one row
    assert [t[0] for t in client.tokens[3:]] == [None] * 7  # the stopped row's slots
