"""Text generation on CPU at speed: the reference model (model/modeling.py) computing with the CPU kernels'
method (model/methods.py CpuKernelsMethod: the compiled kernels, K-pruned weights stored as W^T, torch's fused
attention, the fused decode step) and a preallocated KV cache (`wide-export generate`, `wide-export serve`'s CPU
engine, and the WIDE side of `bench generate`).

    gen = CpuGenerator.load(Path("ckpt"))                  # threads set once: torch.set_num_threads
    out = gen.run([gen.encode("Once upon")], 64, Sampling(temperature=0.8, top_p=0.95),
                  on_token=lambda step, ids: ...)
    out.tokens, out.prefill_s, out.decode_s

`dense=True` executes every group (the base model, through the same path): WIDE's own dense baseline."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch

from wide_export.base.errors import WideError
from wide_export.generation.torch_step import Sampling, generate

DTYPES = ("float32", "bfloat16", "float16")


@dataclass
class Generated:
    tokens: list[list[int]]  # new tokens per row
    prefill_s: float  # the first step: the prompt's forward and the first token
    decode_s: float  # every later step
    steps: int
    prompt_tokens: int = 0  # every row's prompt tokens together

    @property
    def prefill_tok_s(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tok_s(self) -> float:
        rows = len(self.tokens)
        return rows * max(self.steps - 1, 0) / self.decode_s if self.decode_s > 0 else 0.0


@dataclass
class CpuGenerator:
    loaded: object  # checkpoint.LoadedModel
    encode: Optional[Callable[[str], list[int]]]  # None: the folder has no tokenizer (ids only)
    decode: Optional[Callable[[list[int]], str]]
    eos: set[int] = field(default_factory=set)
    kernels: str = ""  # the kernels' instruction set ('' when they could not be built: the dense path)

    @classmethod
    def load(cls, model_dir: Optional[Path] = None, *, router: Optional[Path] = None, lora: Optional[Path] = None,
             lora_scale: float = 2.0, dtype: str = "float32", dense: bool = False,
             threads: Optional[int] = None) -> "CpuGenerator":
        from wide_export.checkpoint import load_wide_model
        from wide_export.cpu import ops
        from wide_export.model.methods import CpuKernelsMethod
        from wide_export.checkpoint.tokens import special_tokens

        if dtype not in DTYPES:
            raise WideError(f"--dtype {dtype} is not one the CPU kernels take", f"choose one of {', '.join(DTYPES)}")
        if threads is not None:
            if threads < 1:
                raise WideError(f"--threads {threads} must be >= 1", "e.g. --threads 2")
            torch.set_num_threads(threads)
        loaded = load_wide_model(model_dir, router=router, lora=lora, lora_scale=lora_scale, dtype=dtype,
                                 check_finite=True)
        loaded.model.eval()
        loaded.model.set_force_execute(dense)
        loaded.model.use_method(CpuKernelsMethod())  # chosen here, for as long as the generator holds the model
        encode = decode = None
        if loaded.is_demo:
            from wide_export.model.demo_tokenizer import demo_tokenizer

            tok = demo_tokenizer()
            def encode(text: str, add_special_tokens: bool = True) -> list[int]:
                return tok(text, add_special_tokens=add_special_tokens)["input_ids"]

            def decode(ids: list[int]) -> str:
                return tok.decode(ids, skip_special_tokens=True)
        else:
            from wide_export.checkpoint.text import find_codec

            # None: no tokenizer, prompts as ids; a damaged one is a WideError naming its file
            encode, decode = find_codec(loaded.model_dir or Path(model_dir)) or (None, None)
        eos = special_tokens(loaded).get("eos_token_id")
        eos = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
        return cls(loaded, encode, decode, eos, ops.isa())

    @property
    def model(self):
        return self.loaded.model

    def run(self, prompts: list[list[int]], max_new_tokens: int, sampling: Optional[Sampling] = None,
            on_token: Optional[Callable[[int, object], None]] = None, stop_at_eos: bool = True) -> Generated:
        """New tokens for prompts of one length (a batch of rows), timed: prefill = the first step."""
        if not prompts or len({len(p) for p in prompts}) != 1 or not prompts[0]:
            raise WideError("the prompts of one run must be non-empty and of one length",
                            "run prompts of different lengths one at a time")
        vocab = self.model.config.vocab_size
        if any(not 0 <= i < vocab for p in prompts for i in p):
            raise WideError(f"a prompt token id is outside the vocabulary (0..{vocab - 1})", "check --ids")
        if len(prompts[0]) + max_new_tokens > self.model.config.max_position_embeddings:
            raise WideError(f"prompt ({len(prompts[0])}) + new tokens ({max_new_tokens}) exceed the model's "
                            f"{self.model.config.max_position_embeddings} positions", "lower --max-new")
        marks: list[float] = []

        def seen(step: int, ids) -> None:
            marks.append(time.perf_counter())
            if on_token is not None:
                on_token(step, ids)

        def stop(ids) -> bool:
            return stop_at_eos and bool(self.eos) and all(int(i) in self.eos for i in ids)

        start = time.perf_counter()
        new = generate(self.model, torch.tensor(prompts), max_new_tokens, sampling, seen, stop)
        prefill = marks[0] - start if marks else 0.0
        decode = marks[-1] - marks[0] if len(marks) > 1 else 0.0
        return Generated(new.tolist(), prefill, decode, len(marks), len(prompts) * len(prompts[0]))

    def stream(self, prompt: list[int], max_new_tokens: int, sampling: Optional[Sampling] = None,
               on_token: Optional[Callable[[int], None]] = None,
               stop: Optional[Callable[[int], bool]] = None) -> list[int]:
        """One prompt's new tokens, each handed to on_token(id) as it is chosen; stop(id) ends after that token
        (the OpenAI front door's engine, serving/cpu_engine.py). The caller checks the prompt's ids and length."""
        new = generate(self.model, torch.tensor([prompt]), max_new_tokens, sampling,
                       None if on_token is None else (lambda _step, ids: on_token(int(ids[0]))),
                       None if stop is None else (lambda ids: stop(int(ids[0]))))
        return new[0].tolist()
