"""In-flight batching for the streaming generation model (copied as `<model>/1/inflight.py`).

Self-contained (numpy only) like model.py, which loads it from its own folder.

`Batch` holds the running sequences' KV cache as one left-padded batch: a
sequence joins after its prefill (its cache and the batch's are left-padded to
a common width, the attention mask marks the padding, positions stay per
sequence) and leaves when it is done or its client went away (its rows are
dropped and columns of padding shared by every remaining row are cut). While
nobody joins or leaves, each step's presents are bound unchanged as the next
step's past (OrtValues with ONNX Runtime, pb_utils GPU tensors with BLS).
A join or a leave rebuilds the cache where it lies (`cache_ops`): with numpy
when it is in host memory (CPU), with PyTorch through DLPack when it is on a
device (CUDA OrtValues, pb_utils GPU tensors), so it never crosses the PCIe
bus. The device path needs PyTorch in the server's Python; the CPU path does
not import it.

`Scheduler` runs a `Batch` on its own thread: requests submitted while others
decode are prefilled together at the next step and join; finished ones leave
at once instead of waiting for the whole batch (TensorRT-LLM calls this
in-flight batching). `Scheduler.drain()` runs the same loop in the caller's
thread over the jobs submitted before it: static batching is this loop with
no joins, and the only generation loop of the model.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

# (feeds by input name, phase) -> (logits [B, T, V], presents [(key, value)] per layer)
StepFn = Callable[[dict, str], tuple]
# (last-position logits [B, V], rows, per-row generators) -> next token per row [B]
ChooseFn = Callable[[np.ndarray, list, list], np.ndarray]


def _left_pad(array: np.ndarray, width: int, axis: int) -> np.ndarray:
    missing = width - array.shape[axis]
    if missing == 0:
        return array
    pad = [(0, 0)] * array.ndim
    pad[axis] = (missing, 0)
    return np.pad(array, pad)


def in_host_memory(value) -> bool:
    """Whether a cache tensor lies in host memory: numpy arrays, torch tensors, pb_utils.Tensor
    (`is_cpu()`), OrtValues (`device_name()`), else any DLPack object (`__dlpack_device__`)."""
    if isinstance(value, np.ndarray):
        return True
    if type(value).__module__.split(".")[0] == "torch":
        return value.device.type == "cpu"
    if callable(getattr(value, "is_cpu", None)):
        return bool(value.is_cpu())
    if callable(getattr(value, "device_name", None)):
        return value.device_name().lower() == "cpu"
    if callable(getattr(value, "__dlpack_device__", None)):
        return value.__dlpack_device__()[0] in (1, 3)  # kDLCPU, kDLCUDAHost
    return True


class NumpyCacheOps:
    """Cache rebuilds in host memory (the CPU path): numpy only."""

    name = "numpy"

    @staticmethod
    def tensor(value) -> np.ndarray:
        if isinstance(value, np.ndarray):
            return value
        if callable(getattr(value, "as_numpy", None)):  # pb_utils.Tensor in CPU memory
            return value.as_numpy()
        return value.numpy()  # OrtValue (or a CPU torch tensor)

    def join(self, old, new, width: int) -> np.ndarray:
        """Rows of `old` then rows of `new` [B, H, W, D], each left-padded to `width` along W."""
        return np.concatenate([_left_pad(self.tensor(old), width, 2), _left_pad(self.tensor(new), width, 2)], axis=0)

    def keep(self, value, rows: list, start: int) -> np.ndarray:
        """Rows `rows` of [B, H, W, D], columns from `start` on."""
        return np.ascontiguousarray(self.tensor(value)[rows][:, :, start:])


class TorchCacheOps:
    """Cache rebuilds on the tensors' own device: PyTorch over DLPack (`torch.from_dlpack` takes
    OrtValues with `__dlpack__`, pb_utils.Tensor and torch tensors without copying). Results are
    contiguous torch tensors, which the steps bind by pointer (ONNX Runtime) or pass on by DLPack
    (BLS)."""

    name = "dlpack"

    def __init__(self):
        try:
            import torch
        except ImportError:
            raise RuntimeError("in-flight batching with the KV cache on a GPU needs PyTorch in the server's "
                               "Python (rows join and leave the batch on the device through DLPack): "
                               "pip install torch there") from None
        self.torch = torch

    def tensor(self, value):
        if isinstance(value, self.torch.Tensor):
            return value
        if not callable(getattr(value, "__dlpack__", None)):
            raise RuntimeError(f"a {type(value).__name__} on a device has no __dlpack__ (onnxruntime's OrtValue "
                               "has it in recent releases, e.g. 1.32): upgrade onnxruntime in the server's Python")
        return self.torch.from_dlpack(value)

    def _left_pad(self, t, width: int):
        missing = width - t.shape[2]
        if missing == 0:
            return t
        out = t.new_zeros((t.shape[0], t.shape[1], width, t.shape[3]))
        out[:, :, missing:] = t
        return out

    def join(self, old, new, width: int):
        return self.torch.cat([self._left_pad(self.tensor(old), width), self._left_pad(self.tensor(new), width)],
                              dim=0).contiguous()

    def keep(self, value, rows: list, start: int):
        t = self.tensor(value)
        index = self.torch.tensor(rows, dtype=self.torch.long, device=t.device)
        return t.index_select(0, index)[:, :, start:].contiguous()


def cache_ops(value):
    """The ops that rebuild a cache holding `value` where it lies."""
    return NumpyCacheOps() if in_host_memory(value) else TorchCacheOps()


@dataclass(eq=False)  # identity: rows hold numpy prompts
class Active:
    """One row in the running batch."""

    row: object  # generation_model.Row: prompt, max_new_tokens, temperature, top_p, seed
    rng: np.random.Generator
    tokens: list = field(default_factory=list)  # chosen so far; the last one is not in the cache yet

    @property
    def remaining(self) -> int:
        """Decode steps this row still needs."""
        return self.row.max_new_tokens - len(self.tokens)


class Batch:
    """The running batch: its rows, their left-padded KV cache and attention mask."""

    def __init__(self, step: StepFn, settings, choose: ChooseFn, max_rows: int, ops=None):
        self.step, self.settings, self.choose, self.max_rows = step, settings, choose, max_rows
        self.ops = ops  # cache ops for joins / leaves; None: chosen by where the cache lies
        self.rows: list[Active] = []
        self.mask = np.zeros((0, 0), dtype=np.int64)  # [B, W]: 1 where the cache holds a real token
        self.past: list = []  # per layer (key, value) [B, H, W, D]
        self.rebuilds: dict = {}  # cache rebuilds (joins + leaves) per cache ops name ("numpy", "dlpack")

    def _rebuild_ops(self, sample):
        ops = self.ops or cache_ops(sample)
        self.rebuilds[ops.name] = self.rebuilds.get(ops.name, 0) + 1
        return ops

    @property
    def width(self) -> int:
        return self.mask.shape[1]

    def fits(self, rows: list) -> bool:
        """Whether `rows` can join now (row count).

        The padded width needs no check: rows are right-aligned, every step adds one
        column to all and `leave` cuts the columns no remaining row uses, so the width is
        always the longest row's own length (prompt + tokens), which validate_row bounded.
        """
        return len(self.rows) + len(rows) <= self.max_rows

    def prefill(self, rows: list) -> list[Active]:
        """Run the prompts of `rows` together (left-padded), choose their first tokens and join them."""
        batch, longest = len(rows), max(r.prompt.size for r in rows)
        ids = np.zeros((batch, longest), dtype=np.int64)
        mask = np.zeros((batch, longest), dtype=np.int64)
        for b, row in enumerate(rows):
            ids[b, longest - row.prompt.size:] = row.prompt
            mask[b, longest - row.prompt.size:] = 1
        s = self.settings
        empty = np.zeros((batch, s.num_kv_heads, 0, s.head_dim), dtype=np.dtype(s.kv_dtype))
        feeds = {s.io["input_ids"]: ids, s.io["attention_mask"]: mask,
                 s.io["position_ids"]: np.clip(np.cumsum(mask, axis=1) - 1, 0, None)}
        for k_name, v_name in s.past_names():
            feeds[k_name], feeds[v_name] = empty, empty
        logits, presents = self.step(feeds, "prefill")
        joined = [Active(row, np.random.default_rng(row.seed)) for row in rows]
        for active, token in zip(joined, self.choose(logits[:, -1, :], rows, [a.rng for a in joined])):
            active.tokens.append(int(token))
        self._join(joined, mask, presents)
        return joined

    def decode(self) -> np.ndarray:
        """One step for every row: feed each row's last token, choose the next."""
        s = self.settings
        mask = np.concatenate([self.mask, np.ones((len(self.rows), 1), dtype=np.int64)], axis=1)
        feeds = {s.io["input_ids"]: np.array([[a.tokens[-1]] for a in self.rows], dtype=np.int64),
                 s.io["attention_mask"]: mask,
                 s.io["position_ids"]: self.mask.sum(axis=1, keepdims=True)}  # real tokens before this one
        for (k_name, v_name), (k, v) in zip(s.past_names(), self.past):
            feeds[k_name], feeds[v_name] = k, v
        logits, self.past = self.step(feeds, "decode")
        self.mask = mask
        tokens = self.choose(logits[:, -1, :], [a.row for a in self.rows], [a.rng for a in self.rows])
        for active, token in zip(self.rows, tokens):
            active.tokens.append(int(token))
        return tokens

    def _join(self, joined: list[Active], mask: np.ndarray, presents: list) -> None:
        if not self.rows:
            self.rows, self.mask, self.past = list(joined), mask, list(presents)
            return
        width = max(self.width, mask.shape[1])
        self.mask = np.concatenate([_left_pad(self.mask, width, 1), _left_pad(mask, width, 1)], axis=0)
        ops = self._rebuild_ops(presents[0][0])
        self.past = [tuple(ops.join(old, new, width) for old, new in zip(pair_old, pair_new))
                     for pair_old, pair_new in zip(self.past, presents)]
        self.rows.extend(joined)

    def leave(self, leaving: list[Active]) -> None:
        """Drop rows; cut the columns that are padding in every remaining row."""
        gone = {id(a) for a in leaving}
        keep = [i for i, a in enumerate(self.rows) if id(a) not in gone]
        if len(keep) == len(self.rows):
            return
        if not keep:
            self.rows, self.mask, self.past = [], np.zeros((0, 0), dtype=np.int64), []
            return
        mask = self.mask[keep]
        start = int(np.argmax(mask.any(axis=0)))  # first column holding a real token for some row
        self.mask = np.ascontiguousarray(mask[:, start:])
        ops = self._rebuild_ops(self.past[0][0])
        self.past = [tuple(ops.keep(t, keep, start) for t in pair) for pair in self.past]
        self.rows = [self.rows[i] for i in keep]


class LengthLimit:
    """The stop rule of a row that only has a length limit (a Job given no `outputs`)."""

    def __init__(self, row):
        self.max_new_tokens, self.tokens, self.finish_reason = row.max_new_tokens, [], None

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def add(self, token: int) -> None:
        self.tokens.append(int(token))
        if len(self.tokens) >= self.max_new_tokens:
            self.finish_reason = "length"


@dataclass(eq=False)
class Job:
    """One request: its rows decode in lock-step, each leaving the batch as soon as its output says
    it is done (`outputs[i]`: add(token), done, finish_reason; textgen.RowOutput in the model).
    `emit(fresh)` gets, per row, the token it chose at this step or None for a row that finished
    earlier, and returns False when the client has gone; `finish(error or None)` sends the final
    response (always called once). `on_admit()` is called when the job's prefill starts."""

    rows: list
    emit: Callable[[list], bool]
    finish: Callable[[Optional[str]], None]
    outputs: list = field(default_factory=list)
    on_admit: Optional[Callable[[], None]] = None
    actives: list = field(default_factory=list)
    gone: bool = False

    def __post_init__(self):
        if not self.outputs:
            self.outputs = [LengthLimit(row) for row in self.rows]

    @property
    def done(self) -> bool:
        return all(out.done for out in self.outputs)


class Scheduler:
    """A thread that admits submitted jobs into a running `Batch` at every step."""

    def __init__(self, batch: Batch, log: Callable[[str], None] = lambda message: None,
                 observe: Optional[Callable[[int, int], None]] = None):
        self.batch, self.log = batch, log
        self.observe = observe  # called after every iteration with (rows decoding, rows waiting)
        self._waiting: deque[Job] = deque()
        self._running: list[Job] = []
        self._cond = threading.Condition()
        self._stopping = False
        self.steps = 0  # graph calls so far (prefill + decode)
        self.max_rows_seen = 0
        self._thread = threading.Thread(target=self._loop, name="wide-inflight", daemon=True)

    def start(self) -> "Scheduler":
        self._thread.start()
        return self

    def submit(self, job: Job) -> None:
        with self._cond:
            if self._stopping:
                job.finish("the model is shutting down")
                return
            self._waiting.append(job)
            self._cond.notify()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop after the current step; jobs not done get an error and their final response."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)
        for job in list(self._running) + list(self._waiting):
            job.finish("the model is shutting down")
        self._running, self._waiting = [], deque()

    def _admit(self) -> list[Job]:
        admitted: list[Job] = []
        rows: list = []
        with self._cond:
            # First come, first served; into an empty batch the first job always fits alone
            # (Triton's max_batch_size bounds its rows).
            while self._waiting and (self.batch.fits(rows + self._waiting[0].rows)
                                     or not (admitted or self.batch.rows)):
                job = self._waiting.popleft()
                admitted.append(job)
                rows += job.rows
        return admitted

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and not self._waiting and not self._running:
                    self._cond.wait()
                if self._stopping:
                    return
            self._iterate_safely()

    def drain(self) -> None:
        """Run in the caller's thread, without starting the scheduler's own, until every job submitted so
        far is finished: static batching, where the jobs of one call decode together and none joins later."""
        while self._waiting or self._running:
            self._iterate_safely()

    def _iterate_safely(self) -> None:
        try:
            self._iterate()
        except Exception as err:  # noqa: BLE001 - fail the jobs in the batch, keep serving
            for job in self._running:
                job.finish(f"generation failed: {err}")
            self._running = []
            self.batch.leave(list(self.batch.rows))
        if self.observe is not None:
            self.observe(len(self.batch.rows), self.waiting_rows)

    def _iterate(self) -> None:
        admitted = self._admit()
        if admitted:  # newcomers are prefilled together, then join the running batch
            self._running.extend(admitted)  # from here on a failing step fails them too
            for job in admitted:
                if job.on_admit is not None:
                    job.on_admit()
            actives = self.batch.prefill([row for job in admitted for row in job.rows])
            self.steps += 1
            start = 0
            for job in admitted:
                job.actives = actives[start:start + len(job.rows)]
                start += len(job.rows)
            self._deliver(admitted)
        if self._running:  # one decode step for everyone in the batch
            self.max_rows_seen = max(self.max_rows_seen, len(self.batch.rows))
            self.batch.decode()
            self.steps += 1
            self._deliver(list(self._running))

    def _deliver(self, jobs: list[Job]) -> None:
        """Hand each job its rows' newest tokens; a row that is done leaves the batch at once, a job
        whose rows are all done or whose client left is finished."""
        leaving: list[Active] = []
        for job in jobs:
            fresh: list = []
            for active, out in zip(job.actives, job.outputs):
                if out.done:  # finished at an earlier step: no longer in the batch
                    fresh.append(None)
                    continue
                out.add(active.tokens[-1])
                fresh.append(active.tokens[-1])
                if out.done:
                    leaving.append(active)
            if not job.emit(fresh):
                job.gone = True
                self.log(f"streaming client went away after {len(job.outputs[0].tokens) - 1} of "
                         f"{job.rows[0].max_new_tokens} tokens; "
                         "its rows left the batch")
                leaving += [a for a, out in zip(job.actives, job.outputs) if not out.done]
            if job.gone or job.done:
                self._running.remove(job)
                job.finish(None)
        self.batch.leave(leaving)

    @property
    def waiting_rows(self) -> int:
        """Rows submitted and not admitted into the batch yet."""
        with self._cond:
            return sum(len(job.rows) for job in self._waiting)
