"""generation/decoding.py pieces that the end-to-end batch tests cannot tell apart on a CPU (mutation
testing): where a cache tensor lies for each kind of tensor the model meets, the cache ops' exact
results at a one-column pad, rebuild counts, the length-only stop rule, the scheduler's thread and its
observer, and the exact messages a client or operator reads."""

from __future__ import annotations

import threading

import numpy as np
import pytest


WAIT_S = 60.0  # a bound for a hung scheduler, not a timing expectation


class PbTensor:  # pb_utils.Tensor: is_cpu()
    def __init__(self, cpu):
        self.cpu = cpu

    def is_cpu(self):
        return self.cpu


class OrtLike:  # OrtValue: device_name()
    def __init__(self, name):
        self.name = name

    def device_name(self):
        return self.name


class DlpackOnly:  # any other DLPack producer
    def __init__(self, device_type):
        self.device_type = device_type

    def __dlpack_device__(self):
        return (self.device_type, 7)


@pytest.mark.parametrize("value, host", [
    (PbTensor(True), True), (PbTensor(False), False),
    (OrtLike("Cpu"), True), (OrtLike("Cuda"), False),
    (DlpackOnly(1), True), (DlpackOnly(3), True), (DlpackOnly(2), False), (DlpackOnly(0), False),
    (object(), True),
], ids=["pb-cpu", "pb-gpu", "ort-cpu", "ort-cuda", "dl-cpu", "dl-cudahost", "dl-cuda", "dl-0", "unknown"])
def test_in_host_memory_for_each_kind_of_tensor(inflight, value, host):
    assert inflight.in_host_memory(value) is host
    if host:
        assert inflight.cache_ops(value).name == "numpy"


def test_in_host_memory_of_torch_tensors_follows_their_device(inflight):
    torch = pytest.importorskip("torch")
    assert inflight.in_host_memory(torch.zeros(1)) is True
    assert inflight.in_host_memory(torch.zeros(1, device="meta")) is False  # not host memory, no GPU needed


def test_numpy_ops_take_pb_utils_and_ort_tensors(inflight):
    ops = inflight.NumpyCacheOps()
    a = np.arange(6.0).reshape(1, 1, 3, 2)

    class AsNumpy:
        def as_numpy(self):
            return a

    class Numpy:
        def numpy(self):
            return a

    assert ops.tensor(AsNumpy()) is a and ops.tensor(Numpy()) is a and ops.tensor(a) is a


def test_torch_ops_pad_by_one_column_and_refuse_tensors_without_dlpack(inflight, rng):
    torch = pytest.importorskip("torch")
    ops, ref = inflight.TorchCacheOps(), inflight.NumpyCacheOps()
    old = rng.normal(size=(2, 1, 4, 3)).astype(np.float32)
    new = rng.normal(size=(1, 1, 5, 3)).astype(np.float32)  # width 5: old is padded by exactly one column
    got = ops.join(torch.from_numpy(old), torch.from_numpy(new), 5)
    np.testing.assert_array_equal(got.numpy(), ref.join(old, new, 5))

    class NoDlpack:
        pass

    with pytest.raises(RuntimeError, match="NoDlpack .*__dlpack__.*upgrade onnxruntime"):
        ops.tensor(NoDlpack())


def test_torch_ops_without_torch_name_the_fix(inflight, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(RuntimeError, match="needs PyTorch.*pip install torch"):
        inflight.TorchCacheOps()


def test_rebuilds_count_each_join_and_leave_once(gm, inflight, tiny_repo, rng):
    folder = str(tiny_repo / "wide_llm" / "1")
    settings = gm.Settings.load(folder)
    batch = inflight.Batch(gm.ort_step(folder, settings), settings, gm.choose_tokens, max_rows=4)
    first = batch.prefill([gm.Row(rng.integers(0, 50, size=3), 4)])  # into an empty batch: no rebuild
    assert batch.rebuilds == {}
    batch.prefill([gm.Row(rng.integers(0, 50, size=5), 4)])
    assert batch.rebuilds == {"numpy": 1}
    batch.leave(first)
    assert batch.rebuilds == {"numpy": 2}
    batch.leave(first)  # not in the batch any more: nothing to rebuild
    assert batch.rebuilds == {"numpy": 2}


def test_length_limit_keeps_int_tokens_and_says_length(inflight, gm):
    out = inflight.LengthLimit(gm.Row(np.array([1]), 2))
    out.add(np.int64(5))
    assert out.tokens == [5] and type(out.tokens[0]) is int and not out.done and out.finish_reason is None
    out.add(6)
    assert out.done and out.finish_reason == "length"


def test_the_scheduler_thread_and_its_observer(gm, inflight, tiny_repo, rng):
    """A daemon thread named wide-inflight (a stuck one never keeps the stub from exiting), `steps`
    counting graph calls from 0, `observe` seeing (rows decoding, rows waiting) after each iteration."""
    folder = str(tiny_repo / "wide_llm" / "1")
    settings = gm.Settings.load(folder)
    ort = gm.ort_step(folder, settings)
    calls = []

    def step(feeds, phase):
        calls.append(phase)
        return ort(feeds, phase)

    seen = []
    sched = inflight.Scheduler(inflight.Batch(step, settings, gm.choose_tokens, max_rows=2),
                               observe=lambda running, waiting: seen.append((running, waiting)))
    assert sched.steps == 0 and sched.max_rows_seen == 0 and sched.waiting_rows == 0
    assert sched._thread is None  # no thread (and no reference cycle through one) before start()
    done = threading.Event()
    finals = []
    job = inflight.Job(rows=[gm.Row(rng.integers(0, 50, size=3), 3)], emit=lambda fresh: True,
                       finish=lambda error: (finals.append(error), done.set()))
    sched.submit(job)
    assert sched.waiting_rows == 1
    sched.start()
    assert sched._thread.daemon and sched._thread.name == "wide-inflight"
    try:
        assert done.wait(WAIT_S)
    finally:
        sched.stop()
    assert finals == [None] and sched.steps == len(calls) == 3 and sched.max_rows_seen == 1
    assert seen[0] == (1, 0) and seen[-1] == (0, 0)
    late = []
    sched.submit(inflight.Job(rows=job.rows, emit=lambda fresh: True, finish=late.append))
    assert late == ["the model is shutting down"]


def test_stop_tells_waiting_jobs_why(gm, inflight, tiny_repo, rng):
    folder = str(tiny_repo / "wide_llm" / "1")
    settings = gm.Settings.load(folder)
    sched = inflight.Scheduler(inflight.Batch(gm.ort_step(folder, settings), settings, gm.choose_tokens, 1))
    finals = []
    sched.submit(inflight.Job(rows=[gm.Row(np.array([1, 2]), 2)], emit=lambda fresh: True, finish=finals.append))
    sched.stop()  # never started: the job is still waiting
    assert finals == ["the model is shutting down"]


def test_seeded_sampling_in_the_running_batch_equals_static_generation(gm, inflight, tiny_repo, rng):
    """Each row samples with its own generator seeded by its request (`seed`): joining a running batch
    does not change what a seeded request gets."""
    folder = str(tiny_repo / "wide_llm" / "1")
    settings = gm.Settings.load(folder)
    step = gm.ort_step(folder, settings)
    rows = [gm.Row(rng.integers(0, 50, size=n), 6, temperature=3.0, seed=s) for n, s in ((4, 11), (7, 12))]
    want = [gm.generate(step, settings, [row])[0] for row in rows]
    batch = inflight.Batch(step, settings, gm.choose_tokens, max_rows=4)
    first = batch.prefill([rows[0]])
    batch.decode()
    second = batch.prefill([rows[1]])  # joins a running batch
    while any(a.remaining > 0 for a in batch.rows):
        batch.decode()
    np.testing.assert_array_equal(first[0].tokens[:6], want[0])
    np.testing.assert_array_equal(second[0].tokens[:6], want[1])
    assert not np.array_equal(want[0], gm.generate(step, settings, [gm.Row(rows[0].prompt, 6)])[0])  # it sampled


def test_a_client_that_leaves_is_logged_in_one_line(gm, inflight, tiny_repo, rng):
    folder = str(tiny_repo / "wide_llm" / "1")
    settings = gm.Settings.load(folder)
    logs, done = [], threading.Event()
    sched = inflight.Scheduler(inflight.Batch(gm.ort_step(folder, settings), settings, gm.choose_tokens, 2),
                               logs.append).start()
    try:
        sched.submit(inflight.Job(rows=[gm.Row(rng.integers(0, 50, size=3), 5)], emit=lambda fresh: False,
                                  finish=lambda error: done.set()))
        assert done.wait(WAIT_S)
    finally:
        sched.stop()
    assert logs == ["streaming client went away after 0 of 5 tokens; its rows left the batch"]


def test_a_cache_on_the_device_is_rebuilt_there_without_being_told(gm, inflight, tiny_repo, tiny, rng):
    """Presents that say they lie in GPU memory (pb_utils tensors, `is_cpu()` False; the fake's memory is
    host memory so this runs on a CPU) are joined and cut with the DLPack ops, chosen from the cache
    itself (no ops forced), and every row still gets the reference tokens."""
    torch = pytest.importorskip("torch")
    from tests.triton import fake_pb_utils, tiny_llm
    from tests.triton.support import drive_staggered

    folder = str(tiny_repo / "wide_llm" / "1")
    settings = gm.Settings.load(folder)
    ort = gm.ort_step(folder, settings)

    def gpu_step(feeds, phase):
        feeds = {k: torch.from_dlpack(v) if isinstance(v, fake_pb_utils.Tensor) else v for k, v in feeds.items()}
        logits, presents = ort(feeds, phase)
        return logits, [tuple(fake_pb_utils.Tensor("present", t.numpy(), gpu=True) for t in pair)
                        for pair in presents]

    batch = inflight.Batch(gpu_step, settings, gm.choose_tokens, max_rows=4)
    plan = [(0, 3, 5), (1, 6, 2), (2, 2, 4)]
    rows = {i: gm.Row(rng.integers(0, tiny_llm.VOCAB, size=n), m) for i, (_, n, m) in enumerate(plan)}
    done, _, _ = drive_staggered(batch, rows, plan, ticks=20)
    assert set(batch.rebuilds) == {"dlpack"} and batch.rebuilds["dlpack"] >= 3
    for i, row in rows.items():
        np.testing.assert_array_equal(done[i], tiny_llm.reference_greedy(tiny[1], row.prompt, row.max_new_tokens))


def test_a_row_finishing_in_the_step_a_client_leaves_still_leaves(gm, inflight, tiny_repo, rng):
    """At one step job A's row reaches its length and job B's client goes away: both rows leave. A
    later job then decodes alone (a stale row would decode beside it and hold a slot), and `steps`
    counts every graph call, the later prefill included."""
    folder = str(tiny_repo / "wide_llm" / "1")
    settings = gm.Settings.load(folder)
    ort = gm.ort_step(folder, settings)
    calls = []

    def step(feeds, phase):
        calls.append((phase, feeds["input_ids"].shape[0]))
        return ort(feeds, phase)

    sched = inflight.Scheduler(inflight.Batch(step, settings, gm.choose_tokens, max_rows=2))
    done = [threading.Event() for _ in range(3)]
    sent = []

    def leaving_after_2(fresh):
        sent.append(fresh)
        return len(sent) <= 2  # its 3rd token finds it gone

    sched.submit(inflight.Job(rows=[gm.Row(rng.integers(0, 50, size=3), 3)], emit=lambda fresh: True,
                              finish=lambda error: done[0].set()))
    sched.submit(inflight.Job(rows=[gm.Row(rng.integers(0, 50, size=4), 9)], emit=leaving_after_2,
                              finish=lambda error: done[1].set()))
    sched.start()
    try:
        assert done[0].wait(WAIT_S) and done[1].wait(WAIT_S)
        assert calls == [("prefill", 2), ("decode", 2), ("decode", 2)]  # both gone at the 3rd token
        assert sched.batch.rows == []
        sched.submit(inflight.Job(rows=[gm.Row(rng.integers(0, 50, size=2), 3)], emit=lambda fresh: True,
                                  finish=lambda error: done[2].set()))
        assert done[2].wait(WAIT_S)
    finally:
        sched.stop()
    assert calls[3:] == [("prefill", 1), ("decode", 1), ("decode", 1)]
    assert sched.steps == len(calls) == 6


def test_drain_runs_the_submitted_jobs_to_their_end_in_the_callers_thread(gm, inflight, tiny_repo, tiny, rng):
    """Static batching: drain() runs the scheduler's loop here (no thread started) until every job
    submitted before it is finished; each row's tokens are the reference's, and a row that ends early
    leaves the batch at once (the widths stay each remaining row's own)."""
    from tests.triton import tiny_llm

    folder = str(tiny_repo / "wide_llm" / "1")
    settings = gm.Settings.load(folder)
    ort = gm.ort_step(folder, settings)
    threads, rows_per_call = set(), []

    def step(feeds, phase):
        threads.add(threading.current_thread().name)
        rows_per_call.append(feeds["input_ids"].shape[0])
        return ort(feeds, phase)

    sched = inflight.Scheduler(inflight.Batch(step, settings, gm.choose_tokens, max_rows=3))
    rows = [gm.Row(rng.integers(0, 50, size=n), m) for n, m in ((3, 2), (6, 5), (2, 4))]
    finals = []
    jobs = [inflight.Job(rows=rows[:2], emit=lambda fresh: True, finish=finals.append),
            inflight.Job(rows=rows[2:], emit=lambda fresh: True, finish=finals.append)]
    for job in jobs:
        sched.submit(job)
    sched.drain()
    assert sched._thread is None and threads == {threading.current_thread().name}
    assert finals == [None, None] and sched.batch.rows == [] and sched.waiting_rows == 0
    for out, row in zip(jobs[0].outputs + jobs[1].outputs, rows):
        assert out.tokens == list(tiny_llm.reference_greedy(tiny[1], row.prompt, row.max_new_tokens))
    assert rows_per_call == [3, 3, 2, 2, 1]  # 2 tokens: leaves after step 2; 4 tokens: after step 4


def test_drain_finishes_every_job_with_a_failing_step_and_returns(gm, inflight, tiny_repo):
    folder = str(tiny_repo / "wide_llm" / "1")
    settings = gm.Settings.load(folder)
    ort, calls = gm.ort_step(folder, settings), []

    def step(feeds, phase):
        calls.append(phase)
        if len(calls) == 2:
            raise RuntimeError("device lost")
        return ort(feeds, phase)

    sched = inflight.Scheduler(inflight.Batch(step, settings, gm.choose_tokens, max_rows=2))
    finals = []
    for prompt in ([1, 2], [3]):
        sched.submit(inflight.Job(rows=[gm.Row(np.array(prompt), 4)], emit=lambda fresh: True, finish=finals.append))
    sched.drain()
    assert finals == ["generation failed: device lost"] * 2 and sched.batch.rows == [] and calls == ["prefill", "decode"]
