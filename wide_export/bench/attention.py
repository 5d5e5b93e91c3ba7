"""Attention rows of `wide-export bench kernels --attention`: WIDE's attention that skips head groups
(kernels/attention.py) against the dense kernel on the same inputs (torch's scaled_dot_product_attention, which
runs FlashAttention / memory-efficient kernels on a GPU), Llama-3.1-8B heads (32 query / 8 KV of 128, 4 heads a
group), at a sparsity of the attention groups and at 0 %.

Cases: prefill of 4k and 16k tokens (one sequence, causal, per-token masks) and decode of one query per
sequence at batch 1 / 16 / 64 over a past of 4k and 32k (the cache preallocated, every sequence at that
length). A third column times the TensorRT plugin's kernel (`masked_attention_op`: the ONNX op's layout, the
model's `allowed` mask read as bytes; decode through the split decode kernel) on the same inputs. A GPU runs
them; on CPU the kernels only run in Triton's interpreter, so `tiny` cases stand in (their timings mean nothing
and the table says so)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable, Optional

HEADS = dict(Hq=32, Hk=8, D=128, group_heads=4)  # Llama-3.1-8B, recipes/llama-3.1-8b.json's attention groups
GPU_CASES = [("prefill", 1, 4096, 0), ("prefill", 1, 16384, 0), ("decode", 1, 1, 4096), ("decode", 16, 1, 4096),
             ("decode", 64, 1, 4096), ("decode", 1, 1, 32768), ("decode", 16, 1, 32768), ("decode", 64, 1, 32768)]
SHORT_CASES = [("prefill", 1, 4096, 0), ("decode", 16, 1, 4096)]  # gpu-check's: a few seconds
TINY_CASES = [("prefill", 1, 48, 0), ("decode", 2, 1, 96)]
CASE_SETS = {"all": GPU_CASES, "short": SHORT_CASES}
TINY_HEADS = dict(Hq=8, Hk=2, D=64, group_heads=2)


@dataclass
class AttentionRow:
    phase: str  # prefill / decode
    batch: int
    tokens: int  # new tokens per sequence
    past: int  # cached positions before them (decode: the context)
    sparsity: float  # requested fraction of attention groups skipped
    skipped: float  # measured fraction of (token, group) pairs skipped
    dense_ms: float  # torch SDPA, every head
    wide_ms: float  # WIDE's kernel, skipped heads left out
    op_ms: float = 0.0  # the plugin's kernel (WideMaskedAttention as the op states it: allowed mask, op layout)

    @property
    def speedup(self) -> float:
        return self.dense_ms / self.wide_ms if self.wide_ms > 0 else 0.0

    @property
    def op_speedup(self) -> float:
        return self.dense_ms / self.op_ms if self.op_ms > 0 else 0.0


def _inputs(B, T, P, heads, dtype, device, gen, sparsity):
    import torch

    Hq, Hk, D, gh = heads["Hq"], heads["Hk"], heads["D"], heads["group_heads"]
    rnd = lambda *shape: torch.randn(*shape, generator=gen, device=device).to(dtype)  # noqa: E731
    S = P + T
    k, v = rnd(B, Hk, S, D), rnd(B, Hk, S, D)
    mask = (torch.rand(B, T, Hq // gh, generator=gen, device=device) >= sparsity).to(torch.int32)
    q = rnd(B, T, Hq, D)
    return q, k, v, mask


def run_attention_bench(cuda: bool, sparsity: float = 0.5, dtype: str = "bf16", seed: int = 0,
                        cases: Optional[list] = None, reps: int = 20, warmup: int = 3,
                        progress: Optional[Callable[[str], None]] = None) -> list[AttentionRow]:
    import torch
    import torch.nn.functional as F

    from wide_export.bench.common import time_ms
    from wide_export.kernels.attention import decode_attention, masked_attention_op, prefill_attention

    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    heads = HEADS if cuda else TINY_HEADS
    cases = cases or (GPU_CASES if cuda else TINY_CASES)
    device = "cuda" if cuda else "cpu"
    gen = torch.Generator(device=device).manual_seed(seed)
    rows = []
    for phase, B, T, P in cases:
        for s in sorted({0.0, sparsity}):
            if progress:
                progress(f"attention {phase} batch {B}, {T} tokens after {P}, {s:.0%} skipped")
            q, k, v, mask = _inputs(B, T, P, heads, torch_dtype, device, gen, s)
            gh = heads["group_heads"]
            qh = q.transpose(1, 2)  # [B, Hq, T, D] for SDPA and the op
            S = k.shape[2]
            allowed = (torch.arange(S, device=device)[None, :] <= (S - T + torch.arange(T, device=device))[:, None]
                       ).expand(B, 1, T, S)  # the model's mask: causal, no padding

            def op(_i):
                return masked_attention_op(qh, k, v, allowed, mask, gh)
            if phase == "decode":
                q1, m1 = q[:, 0], mask[:, 0]

                def dense(_i):
                    return F.scaled_dot_product_attention(qh, k, v, enable_gqa=True)

                def wide(_i):
                    return decode_attention(q1, k, v, m1, gh)
            else:
                def dense(_i):
                    return F.scaled_dot_product_attention(qh, k, v, is_causal=True, enable_gqa=True)

                def wide(_i):
                    return prefill_attention(q, k, v, mask, gh)
            n = reps if cuda else 1
            rows.append(AttentionRow(phase, B, T, P, s, 1.0 - float(mask.float().mean()),
                                     time_ms(dense, n, warmup if cuda else 1, cuda),
                                     time_ms(wide, n, warmup if cuda else 1, cuda),
                                     time_ms(op, n, warmup if cuda else 1, cuda)))
    return rows


def attention_table(rows: list[AttentionRow], device: str, interpreter: bool):
    from rich.table import Table

    title = f"Attention that skips head groups vs SDPA ({device})"
    if interpreter:
        title += ": Triton interpreter, timings mean nothing"
    table = Table(title=title)
    for col in ("phase", "batch", "tokens", "past", "skipped", "SDPA ms", "WIDE ms", "WIDE vs SDPA", "op ms",
                "op vs SDPA"):
        table.add_column(col, justify="left" if col == "phase" else "right")
    for r in rows:
        table.add_row(r.phase, str(r.batch), str(r.tokens), str(r.past), f"{r.skipped:.0%}", f"{r.dense_ms:.3f}",
                      f"{r.wide_ms:.3f}", f"{r.speedup:.2f}x", f"{r.op_ms:.3f}", f"{r.op_speedup:.2f}x")
    return table


def rows_json(rows: list[AttentionRow]) -> list[dict]:
    return [{**asdict(r), "speedup": r.speedup, "op_speedup": r.op_speedup} for r in rows]
