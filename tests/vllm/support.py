"""Shared pieces of the vLLM tests: checkpoints, the folder, the engine in a child process, the references.

The references are independent of the plugin: transformers with the routers
hooked on and the LoRA merged by hand (tests/model/hf_routing.py, which imports
nothing from wide_export), greedy-decoded one prompt at a time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import make_checkpoint

ROOT = Path(__file__).resolve().parents[2]
SHM = Path("/dev/shm")
# head_dim 32: vLLM's CPU attention takes 32 and up, not the demo's 8
COMMON = dict(num_heads=4, num_kv_heads=2, head_dim=32, hidden_size=128, intermediate_size=192, attn_groups=2,
              ffn_groups=12, num_layers=2, lora=True)
SPECS = {  # one per family, each with a different mix of what the table varies
    "llama": dict(arch="llama", attention_bias=True, seed=3),  # q, k, v and o_proj biases
    "mistral": dict(arch="mistral", sparse_target="attention", seed=4),
    # q/k/v biases. (Not tied: random weights with tied embeddings repeat the last token whatever the routers
    # decide, so the test could not tell WIDE from dense; the tied folder is checked in test_folder.py.)
    "qwen2": dict(arch="qwen2", sparse_target="ffn", seed=5),
    "qwen3": dict(arch="qwen3", hidden_size=96, seed=6),  # q/k norm, head_dim 32 != 96 / 4
}
# A shared prefix longer than two 32-token blocks (vLLM's CPU attention takes multiples of 32): the prompts
# share cached blocks, and the second round finds them all; 32-token chunks split every prompt's prefill.
PREFIX = [1] + [(7 * i + 3) % 250 + 3 for i in range(70)]
PROMPTS = [PREFIX + [5, 7, 9], PREFIX + [50, 60, 70, 80, 90, 100, 110], PREFIX[:40] + [200]]
CACHED = {"enable_prefix_caching": True, "block_size": 32, "enable_chunked_prefill": True,
          "max_num_batched_tokens": 32, "max_num_seqs": 8}
# The KV cache of every engine the tests start, whatever the machine's size: 64 MiB holds 64K tokens of these
# models (about 1 KB each), and two engines (tensor / pipeline parallel ranks, serve beside a test) fit any
# machine that runs the suite. A fraction (--gpu-memory-utilization) would be of the whole machine on CPU.
KV_CACHE_BYTES = 64 << 20


def checkpoint(folder: Path, family: str) -> Path:
    """A random WIDE checkpoint of `family` (HF folder, router.pth, lora.pth) with the demo's byte tokenizer."""
    from wide_export.model.demo_tokenizer import write_demo_tokenizer

    ckpt = make_checkpoint(folder, **{**COMMON, **SPECS[family]})
    write_demo_tokenizer(ckpt)
    _apart(ckpt)
    return ckpt


def _apart(ckpt: Path) -> None:
    """Make the residual stream and its normed copy decide differently: embeddings 4x larger (the stream's RMS
    about 4, the normed stream's about 1) and router biases 8x larger (comparable with the logits' spread), so a
    router fed the normed stream instead of the stream flips many decisions (the synthetic model's stream
    has an RMS near 1, where the two inputs decide alike); o_proj / down_proj 4x larger, so the sublayers
    still move the stream as much as before and the flipped decisions change tokens."""
    import torch
    from safetensors.torch import load_file, save_file

    weights = load_file(str(ckpt / "model.safetensors"))
    weights["model.embed_tokens.weight"] *= 4
    for name in weights:  # and the sublayers' outputs to scale with the stream, so a flipped decision shows
        if name.endswith(("o_proj.weight", "o_proj.bias", "down_proj.weight")):
            weights[name] *= 4
    save_file(weights, str(ckpt / "model.safetensors"), metadata={"format": "pt"})
    routers = torch.load(ckpt / "router.pth", weights_only=True)
    torch.save({k: v * 8 if k.endswith(".router.bias") else v for k, v in routers.items()}, ckpt / "router.pth")


def export(ckpt: Path, out: Path, *extra: str) -> Path:
    """`wide-export vllm` as a user runs it (a child process), the checkpoint's LoRA included."""
    lora = ["--lora", str(ckpt / "lora.pth")] if (ckpt / "lora.pth").is_file() else []
    cmd = [sys.executable, "-c", "from wide_export.cli import main; main()", "vllm", "--model", str(ckpt),
           *lora, "--output", str(out), *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return out


def hf_cache(folder: Path, root: Path) -> Path:
    """`folder` stored as the Hugging Face cache stores a downloaded repository: the snapshot's files are
    links into the same repository's blobs/. Returns the snapshot folder."""
    import shutil

    repo = root / "models--org--wide"
    snapshot = repo / "snapshots" / "0123abcd"
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for i, f in enumerate(sorted(folder.iterdir())):
        blob = repo / "blobs" / f"{i:040x}"
        shutil.copyfile(f, blob)
        (snapshot / f.name).symlink_to(Path("../..") / "blobs" / blob.name)
    return snapshot


def engine_env(ranks: int = 1, **extra: str) -> dict:
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    if ranks > 1:
        env["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(str(i % (os.cpu_count() or 1)) for i in range(ranks))
    env.update(extra)
    return env


def run_engine(folder: Path, tmp: Path, *, prompts=PROMPTS, max_tokens: int = 8, rounds: int = 1,
               env: dict | None = None, timeout: float = 420, expect_fail: bool = False, **llm) -> dict | str:
    """Greedy tokens of `prompts` (one batch) through vLLM's engine in a child process (wide_export.vllm.runner);
    with expect_fail, the child's output (it must fail). /dev/shm segments the run leaves are removed."""
    from wide_export.vllm.runner import MARK

    spec = tmp / f"spec-{len(list(tmp.glob('spec-*')))}.json"
    llm.setdefault("kv_cache_memory_bytes", KV_CACHE_BYTES)
    spec.write_text(json.dumps({"model": str(folder), "prompts": prompts, "max_tokens": max_tokens,
                                "rounds": rounds, "llm": llm}))
    before = set(SHM.glob("vllm*")) if SHM.is_dir() else set()
    try:
        done = subprocess.run([sys.executable, "-m", "wide_export.vllm.runner", str(spec)], capture_output=True,
                              text=True, timeout=timeout, env=env or engine_env(), cwd=str(tmp))
    finally:
        for seg in (set(SHM.glob("vllm*")) if SHM.is_dir() else set()) - before:
            seg.unlink(missing_ok=True)
    text = done.stdout + done.stderr
    if expect_fail:
        assert done.returncode != 0 and MARK not in done.stdout, text[-3000:]
        return text
    lines = [line for line in done.stdout.splitlines() if line.startswith(MARK)]
    assert done.returncode == 0 and lines, text[-6000:]
    return json.loads(lines[-1][len(MARK):])


def reference_tokens(ckpt: Path, prompts=PROMPTS, max_tokens: int = 8, routed: bool = True) -> list[list[int]]:
    """Greedy tokens from transformers with the routers hooked and the LoRA merged by hand (routed=False:
    the same merged weights without routers: the dense twin)."""
    import torch

    from tests.model.hf_routing import load_routed_hf

    ref = load_routed_hf(ckpt, lora=ckpt / "lora.pth")
    if not routed:
        ref.remove()
    ref.model.generation_config.eos_token_id = None  # as the engine runs (ignore_eos): every prompt gets max_tokens
    out = []
    for p in prompts:
        ids = torch.tensor([p])
        with torch.no_grad():
            new = ref.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                                     do_sample=False, pad_token_id=0)
        out.append(new[0, len(p):].tolist())
    return out
