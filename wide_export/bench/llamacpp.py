"""llama.cpp on the same weights: prefill and greedy decode of a GGUF (export/gguf.py) with llama-cpp-python.

The benchmark's dense CPU baseline beside WIDE. It drives llama.cpp through llama-cpp-python's low-level
C API (`llama_cpp.llama_decode` on a `llama_batch`), not the high-level `Llama` class: the only work
besides llama.cpp's own per token is an argmax over the logits row (greedy), no sampler chain, no
detokenization. Several sequences decode in one `llama_batch` (one token of each per step, each its own
sequence id and KV stream), so decode at batch 1 and batch B are both measured the same way.

Where llama-cpp-python is not installed, `unavailable_reason()` is the one line the benchmark prints
instead of the llama.cpp rows (it lives in its own environment: scripts/test-llamacpp.sh builds
.venv-llamacpp, since installing it compiles llama.cpp).
"""

from __future__ import annotations

import collections
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from wide_export.base.errors import WideError

INSTALL_HINT = "scripts/test-llamacpp.sh builds .venv-llamacpp"
KV_TYPES = ("f16", "f32")  # llama.cpp's KV cache element type: f16 is its default


def available() -> bool:
    """llama-cpp-python is importable here."""
    return unavailable_reason() is None


def unavailable_reason() -> Optional[str]:
    """None where llama.cpp can run, else the one line the benchmark prints instead of its rows."""
    from importlib.util import find_spec

    if find_spec("llama_cpp") is None:
        return f"llama.cpp rows skipped: llama-cpp-python is not installed ({INSTALL_HINT})"
    try:
        import llama_cpp  # noqa: F401  (loads libllama: a broken build fails here)
    except Exception as err:  # an OSError from ctypes, an ImportError of its own dependencies
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return f"llama.cpp rows skipped: llama-cpp-python does not load ({first[:160]}; {INSTALL_HINT})"
    return None


@dataclass
class LlamaCppRun:
    """One timed run: prefill of each prompt (one sequence per llama_decode call), then `decode_steps`
    greedy steps with every sequence in one batch."""

    batch: int  # sequences decoded together
    prompt_tokens: int  # tokens per prompt (the prompts of one run have the same length)
    decode_steps: int  # decode calls; each gives one token per sequence
    threads: int
    prefill_s: float  # all prompts' prefill (llama_decode + argmax of the last position), summed
    decode_s: float  # all decode steps
    prefill_tok_s: float  # prompt tokens / prefill_s
    decode_tok_s: float  # batch * decode_steps / decode_s (0.0 when decode_steps is 0)
    tokens: list[list[int]] = field(default_factory=list)  # per sequence: greedy ids, prefill's first
    kv_type: str = "f16"
    gguf: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


class _Log:
    """llama.cpp's log lines, kept (the last few) instead of printed: verbose=False, and the reason of a
    failed load comes from them. Installed once, for the process (llama.cpp has one log callback)."""

    def __init__(self):
        import ctypes

        import llama_cpp

        self.lines: collections.deque[str] = collections.deque(maxlen=50)

        @llama_cpp.llama_log_callback
        def callback(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
            line = text.decode("utf-8", "replace").strip()
            if line:
                self.lines.append(line)

        self.callback = callback  # referenced here so that ctypes keeps it alive
        llama_cpp.llama_log_set(callback, ctypes.c_void_p(0))

    def reason(self) -> str:
        """The most telling recent line: the last naming an error, else the last naming a failure."""
        for word in ("error", "failed"):
            hits = [ln for ln in self.lines if word in ln.lower()]
            if hits:
                return hits[-1][:240]
        return (list(self.lines) or ["no message from llama.cpp"])[-1][:240]


_LOG: list[_Log] = []


def _log() -> _Log:
    if not _LOG:
        _LOG.append(_Log())
    return _LOG[0]


class LlamaCppModel:
    """A GGUF loaded into llama.cpp with a context for `max_batch` sequences of up to `seq_tokens` each.

    n_threads: llama.cpp's threads for decode and prefill (default torch.get_num_threads(), what the WIDE
    side uses). use_mmap: False reads the weights into memory at load, so no timed step pays a page
    fault. kv_type: "f16" (llama.cpp's default) or "f32" (exact comparisons). flash_attn: None lets
    llama.cpp decide (its default), True / False forces it. Use as a context manager, or close()."""

    def __init__(self, gguf_path: Path | str, *, max_batch: int = 1, seq_tokens: int = 512,
                 n_threads: Optional[int] = None, kv_type: str = "f16", flash_attn: Optional[bool] = None,
                 use_mmap: bool = False):
        reason = unavailable_reason()
        if reason is not None:
            raise WideError(reason.replace("llama.cpp rows skipped: ", ""), INSTALL_HINT)
        if kv_type not in KV_TYPES:
            raise WideError(f"unsupported llama.cpp KV cache type {kv_type!r}", f"choose one of {', '.join(KV_TYPES)}")
        if max_batch < 1 or seq_tokens < 2:
            raise WideError(f"max_batch={max_batch}, seq_tokens={seq_tokens}: need a batch >= 1 and "
                            "sequences of >= 2 tokens", "pass positive sizes")
        path = Path(gguf_path)
        if not path.is_file():
            raise WideError(f"GGUF file not found: {path}", "write one with wide_export.export.gguf.write_gguf")
        import llama_cpp

        if n_threads is None:
            import torch

            n_threads = torch.get_num_threads()
        self.path, self.threads, self.kv_type = path, int(n_threads), kv_type
        self.max_batch, self.seq_tokens = int(max_batch), int(seq_tokens)
        self._lib = llama_cpp
        log = _log()
        log.lines.clear()  # a failure below is explained by this load's lines only
        llama_cpp.llama_backend_init()
        mparams = llama_cpp.llama_model_default_params()
        mparams.n_gpu_layers = 0
        mparams.load_mode = llama_cpp.LLAMA_LOAD_MODE_MMAP if use_mmap else llama_cpp.LLAMA_LOAD_MODE_NONE
        self._model = llama_cpp.llama_model_load_from_file(str(path).encode(), mparams)
        if not self._model:
            raise WideError(f"llama.cpp cannot load {path}: {log.reason()}",
                            "write the file with wide_export.export.gguf.write_gguf")
        self._ctx = None
        self._batch = None
        try:
            vocab = llama_cpp.llama_model_get_vocab(self._model)
            self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(vocab))
            cparams = llama_cpp.llama_context_default_params()
            # one KV stream per sequence (kv_unified false): each holds seq_tokens, llama.cpp pads to 256
            cparams.n_seq_max = self.max_batch
            cparams.n_ctx = self.max_batch * self.seq_tokens
            cparams.n_batch = max(self.seq_tokens, self.max_batch)  # a whole prompt in one llama_decode
            cparams.n_ubatch = cparams.n_batch
            cparams.n_threads = cparams.n_threads_batch = self.threads
            cparams.no_perf = True
            cparams.kv_unified = False
            if flash_attn is not None:
                cparams.flash_attn_type = (llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn
                                           else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED)
            ggml = {"f16": llama_cpp.GGML_TYPE_F16, "f32": llama_cpp.GGML_TYPE_F32}[kv_type]
            cparams.type_k = cparams.type_v = ggml
            self._ctx = llama_cpp.llama_init_from_model(self._model, cparams)
            if not self._ctx:
                raise WideError(f"llama.cpp cannot create a context for {path}: {log.reason()}",
                                "lower max_batch or seq_tokens")
            self._batch = llama_cpp.llama_batch_init(cparams.n_batch, 0, self.max_batch)
        except BaseException:
            self.close()
            raise

    # ---- low level ----------------------------------------------------------------------------------
    def _decode(self, entries: Sequence[tuple[int, int, int, bool]]) -> None:
        """One llama_decode of (token, position, sequence, wants_logits) entries."""
        b = self._batch
        for i, (tok, pos, seq, out) in enumerate(entries):
            b.token[i] = tok
            b.pos[i] = pos
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = seq
            b.logits[i] = 1 if out else 0
        b.n_tokens = len(entries)
        rc = self._lib.llama_decode(self._ctx, b)
        if rc != 0:
            raise WideError(f"llama.cpp's llama_decode failed (code {rc}) on {len(entries)} tokens: "
                            f"{_log().reason()}", "shorter prompts, or a larger seq_tokens")
        self._lib.llama_synchronize(self._ctx)

    def _row(self, i: int):
        """The logits of position i of the last llama_decode's batch (-1: its last output), a view."""
        import numpy as np

        ptr = self._lib.llama_get_logits_ith(self._ctx, i)
        if not ptr:
            raise WideError(f"llama.cpp has no logits for batch position {i}: {_log().reason()}",
                            "request logits for that position")
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))

    def _argmax(self, i: int) -> int:
        return int(self._row(i).argmax())

    def logits(self, i: int = -1):
        """A copy of the logits (numpy float32) of batch position i of the last decode (-1: its last output)."""
        return self._row(i).copy()

    def reset(self) -> None:
        """Forget every sequence (the KV cache is emptied)."""
        self._lib.llama_memory_clear(self._lib.llama_get_memory(self._ctx), True)

    # ---- the timed run ------------------------------------------------------------------------------
    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> LlamaCppRun:
        """Prefill each prompt (sequence i = prompts[i], one llama_decode each, timed), then
        max_new_tokens - 1 greedy decode steps with all sequences in one batch (timed); every sequence
        yields max_new_tokens greedy ids (the first from its prefill). The KV cache is emptied first."""
        prompts = [list(map(int, p)) for p in prompts]
        n = len(prompts)
        if not 1 <= n <= self.max_batch:
            raise WideError(f"{n} prompts for a context made for {self.max_batch}", "pass max_batch >= the prompts")
        length = len(prompts[0])
        if length < 1 or any(len(p) != length for p in prompts):
            raise WideError("the prompts are empty or of different lengths", "pass prompts of one length >= 1")
        if max_new_tokens < 1 or length + max_new_tokens > self.seq_tokens:
            raise WideError(f"prompt {length} + {max_new_tokens} new tokens do not fit seq_tokens={self.seq_tokens}",
                            "pass max_new_tokens >= 1 and a larger seq_tokens")
        bad = [t for p in prompts for t in p if not 0 <= t < self.n_vocab]
        if bad:
            raise WideError(f"token id {bad[0]} is outside the vocabulary (0..{self.n_vocab - 1})",
                            "pass ids of this model")
        self.reset()
        tokens: list[list[int]] = [[] for _ in range(n)]
        clock = time.perf_counter
        prefill = 0.0
        for s, prompt in enumerate(prompts):
            start = clock()
            self._decode([(tok, pos, s, pos == length - 1) for pos, tok in enumerate(prompt)])
            tokens[s].append(self._argmax(length - 1))
            prefill += clock() - start
        steps = max_new_tokens - 1
        start = clock()
        for step in range(steps):
            self._decode([(tokens[s][-1], length + step, s, True) for s in range(n)])
            for s in range(n):
                tokens[s].append(self._argmax(s))
        decode = clock() - start if steps else 0.0
        return LlamaCppRun(
            batch=n, prompt_tokens=length, decode_steps=steps, threads=self.threads,
            prefill_s=prefill, decode_s=decode,
            prefill_tok_s=n * length / prefill if prefill > 0 else 0.0,
            decode_tok_s=n * steps / decode if decode > 0 else 0.0,
            tokens=tokens, kv_type=self.kv_type, gguf=str(self.path))

    def close(self) -> None:
        lib = self._lib
        if getattr(self, "_batch", None) is not None:
            lib.llama_batch_free(self._batch)
            self._batch = None
        if getattr(self, "_ctx", None):
            lib.llama_free(self._ctx)
            self._ctx = None
        if getattr(self, "_model", None):
            lib.llama_model_free(self._model)
            self._model = None

    def __enter__(self) -> "LlamaCppModel":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def run_llamacpp(gguf_path: Path | str, prompts: Sequence[int] | Sequence[Sequence[int]], max_new_tokens: int, *,
                 n_threads: Optional[int] = None, kv_type: str = "f16", flash_attn: Optional[bool] = None,
                 warmup: bool = True, use_mmap: bool = False) -> LlamaCppRun:
    """Load `gguf_path`, optionally run once untimed (warm-up), then time prefill + greedy decode.

    prompts: one prompt (a list of ids: batch 1) or several of one length (batch = their number, decoded
    together). Returns a LlamaCppRun (tokens/s of prefill and decode, the greedy ids per sequence)."""
    prompts = list(prompts)
    if not prompts:
        raise WideError("no prompt given", "pass a list of token ids (or several of one length)")
    batch = [list(p) for p in prompts] if hasattr(prompts[0], "__len__") else [prompts]
    if not batch[0]:
        raise WideError("no prompt given", "pass a list of token ids (or several of one length)")
    with LlamaCppModel(gguf_path, max_batch=len(batch), seq_tokens=len(batch[0]) + max_new_tokens,
                       n_threads=n_threads, kv_type=kv_type, flash_attn=flash_attn, use_mmap=use_mmap) as model:
        if warmup:
            model.generate(batch, min(max_new_tokens, 2))
        return model.generate(batch, max_new_tokens)


# ours -> llama.cpp's GGUF types of the same weights; with bfloat16 llama.cpp also runs f16, its usual half precision
GGUF_TYPES = {"float32": ("f32",), "bfloat16": ("bf16", "f16"), "float16": ("f16",)}


def for_checkpoint(model, dtype: str, work: Path, run, say=None) -> tuple[dict, Optional[str]]:
    """llama.cpp beside a benchmark of `model` (a checkpoint folder, or a LoadedModel: its router's LoRA merged)
    in `dtype` (float32 / bfloat16 / float16).

    For each GGUF type of GGUF_TYPES[dtype]: write the model's GGUF into `work` (export/gguf.py), call
    run(gguf_path) and delete the file. Returns ({"llama.cpp f32": run's result, ...}, None), or ({}, the one
    line the benchmark prints instead of the rows) where llama-cpp-python is not installed."""
    why = unavailable_reason()
    if why:
        return {}, why
    from wide_export.export.gguf import write_gguf

    say = say or (lambda _m: None)
    out = {}
    for kind in GGUF_TYPES[dtype]:
        say(f"writing the GGUF ({kind}) for llama.cpp")
        # the benchmark feeds llama.cpp token ids, never text: the id vocabulary serves every tokenizer, one whose
        # pre-tokenizer llama.cpp cannot name included (write_gguf refuses to guess one)
        gguf = Path(write_gguf(model, Path(work) / f"model-{kind}.gguf", kind, tokenizer_pre="none").path)
        try:
            out[f"llama.cpp {kind}"] = run(gguf)
        finally:
            gguf.unlink(missing_ok=True)
    return out, None
