"""The one generation loop: a batch of rows that prefill, decode one token per step and leave when done.

Self-contained (numpy only): a generated Triton repository copies it as `<model>/1/decoding.py` beside
model.py, which loads it from its own folder; in the package, generation/torch_step.py, verification, `run-tp` and
the Triton model all run it.

`Batch` holds the running rows and their KV cache as one left-padded batch. Its `step(feeds, phase)` runs
the model once and returns (logits [B, T, V], presents per layer); its `feeds` object turns (ids, mask,
positions, past or None for a prefill) into the step's feeds: the graph's inputs by name
(settings.Settings.feeds) or the plain triple of an in-process step that keeps its own cache
(`PositionalFeeds`). A row joins after its prefill (its cache and the batch's are left-padded to a common
width, the attention mask marks the padding, positions stay per row) and leaves when it is done or its
caller went away (its rows are dropped and columns of padding shared by every remaining row are cut).
While nobody joins or leaves, each step's presents are bound unchanged as the next step's past
(OrtValues with ONNX Runtime, pb_utils GPU tensors with BLS). A join or a leave rebuilds the cache where it
lies (`cache_ops`): with numpy when it is in host memory (CPU), with PyTorch through DLPack when it is on a
device (CUDA OrtValues, pb_utils GPU tensors), so it never crosses the PCIe bus. The device path needs
PyTorch in the server's Python; the CPU path does not import it.

`Scheduler` runs a `Batch` over `Job`s (a request's rows): on its own thread, jobs submitted while others
decode are prefilled together at the next step and join, finished rows leave at once (TensorRT-LLM calls
this in-flight batching). `Scheduler.drain()` runs the same loop in the caller's thread over the jobs
submitted before it: static batching is this loop with no joins. `decode_loop` is one job in lock-step
(every row has the same length limit): the reference, verification, `run-tp` and fast CPU generation.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

# (feeds, phase "prefill" | "decode") -> (logits [B, T, V], presents [(key, value)] per layer)
StepFn = Callable[[object, str], tuple]
# (last-position logits [B, V], rows, per-row generators) -> next token per row [B]
ChooseFn = Callable[[np.ndarray, list, list], np.ndarray]  # or a torch tensor: anything with .tolist()


def _left_pad(array: np.ndarray, width: int, axis: int) -> np.ndarray:
    missing = width - array.shape[axis]
    if missing == 0:
        return array
    pad = [(0, 0)] * array.ndim
    pad[axis] = (missing, 0)
    return np.pad(array, pad)


def positions(attention_mask):
    """position_ids for left padding: the count of real tokens before each position (torch or numpy)."""
    if isinstance(attention_mask, np.ndarray):
        return np.maximum(attention_mask.cumsum(-1) - 1, 0)
    return (attention_mask.cumsum(-1) - 1).clamp(min=0)


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

    row: object  # rows.Row (a request's row) or Prompt: prompt, max_new_tokens, seed, padding, ...
    rng: np.random.Generator
    tokens: list = field(default_factory=list)  # chosen so far; the last one is not in the cache yet

    @property
    def remaining(self) -> int:
        """Decode steps this row still needs."""
        return self.row.max_new_tokens - len(self.tokens)


class Batch:
    """The running batch: its rows, their left-padded KV cache and attention mask. `feeds.feeds(ids, mask,
    positions, past)` makes a step's feeds (past None: the prefill's empty cache)."""

    def __init__(self, step: StepFn, feeds, choose: ChooseFn, max_rows: int, ops=None):
        self.step, self.feeds, self.choose, self.max_rows = step, feeds, choose, max_rows
        self.ops = ops  # cache ops for joins / leaves; None: chosen by where the cache lies
        self.rows: list[Active] = []
        self.mask = np.zeros((0, 0), dtype=np.int64)  # [B, W]: 1 where the cache holds a real token
        self.lengths = np.zeros(0, dtype=np.int64)  # [B]: real tokens in the cache (the mask's row sums)
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
            pad = longest - row.prompt.size
            ids[b, pad:] = row.prompt
            mask[b, pad:] = 1
            lead = row.padding  # the ids a caller padded this row with (the nearest ones), else 0
            ids[b, max(0, pad - len(lead)):pad] = lead[max(0, len(lead) - pad):]
        logits, presents = self.step(self.feeds.feeds(ids, mask, positions(mask), None), "prefill")
        joined = [Active(row, np.random.default_rng(row.seed)) for row in rows]
        for active, token in zip(joined, self.choose(logits[:, -1, :], rows, [a.rng for a in joined])):
            active.tokens.append(int(token))
        self._join(joined, mask, presents)
        return joined

    def decode(self) -> np.ndarray:
        """One step for every row: feed each row's last token, choose the next."""
        mask = np.concatenate([self.mask, np.ones((len(self.rows), 1), dtype=np.int64)], axis=1)
        ids = np.array([a.tokens[-1] for a in self.rows], dtype=np.int64)[:, None]  # a flat list converts faster
        positions = self.lengths[:, None]  # real tokens before this one (never changed: a new array below)
        logits, self.past = self.step(self.feeds.feeds(ids, mask, positions, self.past), "decode")
        self.mask, self.lengths = mask, self.lengths + 1
        tokens = self.choose(logits[:, -1, :], [a.row for a in self.rows], [a.rng for a in self.rows])
        for active, token in zip(self.rows, tokens.tolist()):  # Python ints in one call (numpy or torch, any device)
            active.tokens.append(token)
        return tokens

    def _join(self, joined: list[Active], mask: np.ndarray, presents: list) -> None:
        if not self.rows:
            self.rows, self.mask, self.past = list(joined), mask, list(presents)
            self.lengths = mask.sum(axis=1)
            return
        if not presents:
            raise ValueError("rows cannot join a running batch whose step keeps its own KV cache")
        width = max(self.width, mask.shape[1])
        self.mask = np.concatenate([_left_pad(self.mask, width, 1), _left_pad(mask, width, 1)], axis=0)
        self.lengths = np.concatenate([self.lengths, mask.sum(axis=1)])
        ops = self._rebuild_ops(presents[0][0])
        self.past = [tuple(ops.join(old, new, width) for old, new in zip(pair_old, pair_new))
                     for pair_old, pair_new in zip(self.past, presents)]
        self.rows.extend(joined)

    def leave(self, leaving: list[Active]) -> None:
        """Drop rows; cut the columns that are padding in every remaining row."""
        if not leaving:
            return
        gone = {id(a) for a in leaving}
        keep = [i for i, a in enumerate(self.rows) if id(a) not in gone]
        if len(keep) == len(self.rows):
            return
        if not keep:
            self.rows, self.mask, self.past = [], np.zeros((0, 0), dtype=np.int64), []
            self.lengths = np.zeros(0, dtype=np.int64)
            return
        mask = self.mask[keep]
        start = int(np.argmax(mask.any(axis=0)))  # first column holding a real token for some row
        self.mask = np.ascontiguousarray(mask[:, start:])
        self.lengths = self.lengths[keep]
        if self.past:  # an in-process step keeps its own cache and hands none back
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
    earlier, and returns False when the client has gone (or the caller wants no more tokens);
    `finish(error or None)` sends the final response (always called once). `on_admit()` is called when
    the job's prefill starts."""

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
        # made in start(): a Thread whose target is this scheduler's bound method is a reference cycle, which kept a
        # drained scheduler's batch (its step, its KV cache) alive until the cyclic collector's next full pass
        self._thread: Optional[threading.Thread] = None

    def start(self) -> "Scheduler":
        self._thread = threading.Thread(target=self._loop, name="wide-inflight", daemon=True)
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
        if self._thread is not None and self._thread.is_alive():
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

    def drain(self, reraise: bool = False) -> None:
        """Run in the caller's thread, without starting the scheduler's own, until every job submitted so
        far is finished: static batching, where the jobs of one call decode together and none joins later.
        reraise: a failing step (or callback) raises here after its jobs are finished with the error."""
        while self._waiting or self._running:
            self._iterate_safely(reraise)

    def _iterate_safely(self, reraise: bool = False) -> None:
        try:
            self._iterate()
        except Exception as err:  # noqa: BLE001 - fail the jobs in the batch, keep serving
            for job in self._running:
                job.finish(f"generation failed: {err}")
            self._running = []
            self.batch.leave(list(self.batch.rows))
            if reraise:
                raise
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
                token = active.tokens[-1]
                out.add(token)
                fresh.append(token)
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


def greedy(logits):
    """The most likely token of each row of logits [B, V] (torch or numpy)."""
    return logits.argmax(-1)


@dataclass
class Prompt:
    """A row of `decode_loop`: its real tokens, the tokens to generate, its generator's seed, and the ids its
    caller padded it with (fed as they were, masked; a Triton request's rows are padded with id 0)."""

    prompt: np.ndarray
    max_new_tokens: int
    seed: int = 0
    padding: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))


class PositionalFeeds:
    """The feeds of an in-process step, step((ids, mask, positions)): it keeps its own KV cache."""

    @staticmethod
    def feeds(ids: np.ndarray, mask: np.ndarray, positions: np.ndarray, past) -> tuple:
        return ids, mask, positions


def _left_padded(ids: np.ndarray, mask: np.ndarray) -> list:
    """Each row as (its padding ids, its tokens where `mask` is 1); ValueError unless every row is
    left-padded (0s, then 1s) and holds a token."""
    rows = []
    for b in range(ids.shape[0]):
        pad = int((mask[b] == 0).sum())
        if pad == mask.shape[1] or not (mask[b, :pad] == 0).all() or not (mask[b, pad:] == 1).all():
            raise ValueError(f"row {b} of the attention mask is not left padding (0s, then 1s, at least one 1): "
                             f"{mask[b].tolist()}")
        rows.append((ids[b, :pad], ids[b, pad:]))
    return rows


def decode_loop(step: Callable, input_ids: np.ndarray, attention_mask: Optional[np.ndarray], max_new_tokens: int,
                choose: Callable = greedy, on_token: Optional[Callable[[int, np.ndarray], None]] = None,
                stop: Optional[Callable[[np.ndarray], bool]] = None) -> np.ndarray:
    """New tokens [B, n <= max_new_tokens] (int64) for input_ids [B, T] (rows left-padded by attention_mask,
    None: none are): the rows as one job of a `Scheduler` drained in this thread, in lock-step.

    `step(ids, mask, positions) -> logits [B, T, V]` runs the model and keeps its own KV cache: first the
    prompts (left-padded as given; columns that pad every row are left out), then each step's new ids, the
    mask over past + new positions and their positions (fresh arrays each step, never changed afterwards: a
    step may keep them). choose(logits[:, -1]) picks a token per row; on_token(k, ids [B]) sees them as they are chosen
    (k = 0 after the prefill); stop(ids) ends after those tokens. An error in the step or a callback is
    raised here."""
    ids = np.asarray(input_ids, dtype=np.int64)
    batch = ids.shape[0]
    if max_new_tokens <= 0:
        return np.zeros((batch, 0), np.int64)
    mask = np.ones_like(ids) if attention_mask is None else np.asarray(attention_mask, dtype=np.int64)
    rows = [Prompt(tokens, max_new_tokens, padding=lead) for lead, tokens in _left_padded(ids, mask)]
    emitted: list = []

    def emit(fresh: list) -> bool:
        chosen = np.asarray(fresh, dtype=np.int64)
        emitted.append(chosen)
        if on_token is not None:
            on_token(len(emitted) - 1, chosen)
        return stop is None or not stop(chosen)

    scheduler = Scheduler(Batch(lambda feeds, phase: (step(*feeds), []), PositionalFeeds(),
                                lambda logits, rows, rngs: choose(logits), batch))
    scheduler.submit(Job(rows=rows, emit=emit, finish=lambda error: None))
    scheduler.drain(reraise=True)
    return np.stack(emitted, axis=1)
