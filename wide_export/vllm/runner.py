"""Run a folder through vLLM's offline engine in a child process: greedy tokens, cache hits and timings as JSON.

`python -m wide_export.vllm.runner SPEC.json` prints one line `WIDE_RESULT {...}`.
The engine lives in its own process (vLLM spawns its engine core and workers,
which needs the `__main__` guard, and keeps process-wide state): the tests and
`wide-export bench vllm` start one per configuration. SPEC:
  model         folder
  prompts       list of token-id lists (one batch)
  max_tokens    new tokens per prompt (greedy)
  rounds        how many times the batch is generated (prefix caching is seen from round 2)
  llm           keyword arguments of vllm.LLM (dtype, enforce_eager, tensor_parallel_size, ...)
  timings       list of {"batch": B, "prompt_len": P, "new": N}: time a prefill-only and a full request
The result's `rss_mib` is the resident memory of this process and its children after load; `cpu_paths`
counts which path served the CPU kernels' calls (kind/masked, kind/dense) where the model ran in this
process (VLLM_ENABLE_V1_MULTIPROCESSING=0), before the timings.
"""

from __future__ import annotations

import json
import sys
import time

MARK = "WIDE_RESULT "
DEFAULTS = {"dtype": "float32", "max_model_len": 256, "gpu_memory_utilization": 0.1, "skip_tokenizer_init": True,
            "seed": 0, "disable_log_stats": False}  # stats on: LLM.get_metrics() (prefix-cache hits)


def _metric(llm, name: str) -> float | None:
    try:
        metrics = llm.get_metrics()
    except Exception:  # noqa: BLE001 - metrics off or unsupported: not a result
        return None
    total = None
    for m in metrics:
        if m.name == name and hasattr(m, "value"):
            total = (total or 0) + m.value
    return total


def _timed(llm, params_cls, batch: int, prompt_len: int, new: int, vocab: int) -> dict:
    """Prefill-only (1 new token) and full (new tokens) wall times of one batch of distinct random prompts."""
    import random

    rng = random.Random(prompt_len * 1000 + batch)

    def prompts():  # fresh tokens each call: no prefix-cache hit between the two timings
        return [{"prompt_token_ids": [rng.randrange(3, vocab) for _ in range(prompt_len)]} for _ in range(batch)]

    llm.generate(prompts(), params_cls(max_tokens=2, temperature=0, ignore_eos=True), use_tqdm=False)  # warm-up
    t = time.perf_counter()
    llm.generate(prompts(), params_cls(max_tokens=1, temperature=0, ignore_eos=True), use_tqdm=False)
    first = time.perf_counter() - t
    t = time.perf_counter()
    llm.generate(prompts(), params_cls(max_tokens=new, temperature=0, ignore_eos=True), use_tqdm=False)
    full = time.perf_counter() - t
    step = max(full - first, 1e-9) / max(new - 1, 1)
    return {"batch": batch, "prompt_len": prompt_len, "new": new, "ttft_s": first, "itl_s": step,
            "prefill_tok_s": batch * prompt_len / first, "decode_tok_s": batch / step}


def rss_mib(pid: int | None = None) -> float | None:
    """Resident memory of process `pid` (this one) and all its descendants (vLLM's engine core and workers),
    MiB, from /proc; None where /proc is not there."""
    import os
    from pathlib import Path

    root = pid or os.getpid()
    try:
        parent = {}
        for status in Path("/proc").glob("[0-9]*/status"):
            try:
                fields = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)
            except OSError:
                continue
            parent[int(status.parent.name)] = (int(fields["PPid"]), int(fields.get("VmRSS", "0 kB").split()[0]))
    except OSError:
        return None
    if root not in parent:
        return None
    total, todo = 0, [root]
    while todo:
        p = todo.pop()
        total += parent[p][1]
        todo += [c for c, (pp, _) in parent.items() if pp == p]
    return total / 1024


def run(spec: dict) -> dict:
    from vllm import LLM, SamplingParams

    llm = LLM(model=spec["model"], **{**DEFAULTS, **spec.get("llm", {})})
    out: dict = {"tokens": [], "rounds": [], "rss_mib": rss_mib()}
    params = SamplingParams(max_tokens=spec.get("max_tokens", 8), temperature=0, ignore_eos=True)
    for _ in range(spec.get("rounds", 1)):
        results = llm.generate([{"prompt_token_ids": p} for p in spec.get("prompts", [])], params, use_tqdm=False)
        out["rounds"].append([list(r.outputs[0].token_ids) for r in results])
    out["tokens"] = out["rounds"][0] if out["rounds"] else []
    out["prefix_cache_hits"] = _metric(llm, "vllm:prefix_cache_hits")
    vocab = llm.llm_engine.model_config.get_vocab_size()
    ops = sys.modules.get("wide_export.cpu.ops")  # the CPU kernels' calls, where the model ran in this process
    out["cpu_paths"] = {f"{kind}/{path}": n for (kind, path), n in ops.PATHS.items()} if ops else {}
    out["timings"] = [_timed(llm, SamplingParams, t["batch"], t["prompt_len"], t["new"], vocab)
                      for t in spec.get("timings", [])]
    return out


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    with open(argv[0]) as f:
        spec = json.load(f)
    print(MARK + json.dumps(run(spec)), flush=True)


if __name__ == "__main__":
    main()
