"""llama.cpp on the GGUF of a WIDE checkpoint (wide_export/export/gguf.py, wide_export/bench/llamacpp.py)
against transformers on the same Hugging Face folder, an oracle independent of our code: greedy tokens of
a 32-token prompt and 16 new tokens, for every architecture, LoRA (merged by hand on the transformers side),
RoPE scaling, several sequences in one batch; logits for the tied-embedding and half-precision files.

Marked `llamacpp`: they run where llama-cpp-python is installed (scripts/test-llamacpp.sh, .venv-llamacpp)
and are skipped with the reason elsewhere. A head_dim of 64 (one llama.cpp's CPU kernels support on every
path) and weights of std 1/sqrt(fan_in) make the greedy tokens varied, not one repeated token."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from wide_export.base.errors import WideError

SPEC = dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_layers=2, num_heads=4, num_kv_heads=2,
            head_dim=64, attn_groups=2, ffn_groups=4, rank=16)
PROMPT, NEW = 32, 16


def checkpoint(tmp: Path, lora: bool = False, rope: dict | None = None, **kw) -> Path:
    from wide_export.model.synthetic import SyntheticSpec, write_checkpoint

    folder = write_checkpoint(tmp / "ckpt", SyntheticSpec(**{**SPEC, **kw}), lora=lora)
    if rope:
        cfg = json.loads((folder / "config.json").read_text())
        cfg["rope_parameters"] = {"rope_theta": 10000.0, **rope}
        (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def transformers_model(folder: Path, lora: bool = False, scale: float = 2.0):
    """transformers' own model of the folder in float32; the LoRA merged by hand (W += B @ A * scale)."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    if lora:
        params = dict(model.named_parameters())
        pairs: dict[str, dict[str, torch.Tensor]] = {}
        for key, t in torch.load(folder / "lora.pth", weights_only=True).items():
            base, ab = key[key.index("model.layers."):].rsplit(".lora_", 1)
            pairs.setdefault(base + ".weight", {})[ab[0]] = t.float()
        with torch.no_grad():
            for name, p in pairs.items():
                params[name] += (p["B"] @ p["A"]) * scale
    return model


def greedy(model, prompt: list[int], n: int = NEW) -> list[int]:
    """transformers' greedy continuation, a full forward per step (no cache, no generation config)."""
    import torch

    ids = torch.tensor([prompt])
    out = []
    with torch.no_grad():
        for _ in range(n):
            nxt = int(model(ids).logits[0, -1].argmax())
            out.append(nxt)
            ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
    return out


def prompt(seed: int = 0, length: int = PROMPT) -> list[int]:
    return np.random.default_rng(seed).integers(0, SPEC["vocab_size"], length).tolist()


def run(path: Path, prompts, n: int = NEW):
    """llama.cpp's greedy tokens, exact settings: float32 KV cache, no flash attention."""
    from wide_export.bench.llamacpp import run_llamacpp

    return run_llamacpp(path, prompts, n, kv_type="f32", flash_attn=False, n_threads=2, warmup=False)


CASES = {
    "llama": dict(arch="llama"),
    "llama-attention-bias": dict(arch="llama", attention_bias=True),
    "llama-lora": dict(arch="llama", lora=True),
    "llama-rope-llama3": dict(arch="llama", rope=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                                      high_freq_factor=4.0, original_max_position_embeddings=64)),
    "llama-rope-linear": dict(arch="llama", rope=dict(rope_type="linear", factor=4.0)),
    "mistral": dict(arch="mistral"),
    "qwen2": dict(arch="qwen2"),
    "qwen3": dict(arch="qwen3"),
    "qwen3-lora": dict(arch="qwen3", lora=True),
}


@pytest.mark.llamacpp
@pytest.mark.parametrize("case", list(CASES))
def test_llama_cpp_greedy_tokens_equal_transformers(tmp_path, case):
    from wide_export.export.gguf import write_gguf

    kw = dict(CASES[case])
    folder = checkpoint(tmp_path, **kw)
    lora = folder / "lora.pth" if kw.get("lora") else None
    result = write_gguf(folder, tmp_path / "m.gguf", "f32", lora=lora)
    assert result.lora_pairs == (8 if lora else 0)
    ids = prompt()
    want = greedy(transformers_model(folder, lora=bool(lora)), ids)
    assert len(set(want)) >= 6, want  # a varied continuation, not one token repeated
    got = run(tmp_path / "m.gguf", ids)
    assert got.tokens == [want]
    assert got.batch == 1 and got.prompt_tokens == PROMPT and got.decode_steps == NEW - 1
    assert got.prefill_tok_s > 0 and got.decode_tok_s > 0 and got.threads == 2


@pytest.mark.llamacpp
def test_four_sequences_in_one_batch_each_equal_their_own_greedy_run(tmp_path):
    from wide_export.export.gguf import write_gguf

    folder = checkpoint(tmp_path, arch="qwen3")
    write_gguf(folder, tmp_path / "m.gguf")
    model = transformers_model(folder)
    prompts = [prompt(seed) for seed in range(4)]
    got = run(tmp_path / "m.gguf", prompts)
    assert got.batch == 4 and len(got.tokens) == 4
    assert got.tokens == [greedy(model, p) for p in prompts]
    assert len({tuple(t) for t in got.tokens}) == 4


@pytest.mark.llamacpp
@pytest.mark.parametrize("dtype,tol", [("f32", 1e-4), ("f16", 2e-2), ("bf16", 6e-2)])
def test_prefill_logits_match_transformers_tied_embeddings_too(tmp_path, dtype, tol):
    """Logits of the last prompt position, relative to their spread (tied embeddings make greedy decoding
    repeat one token with these random weights, so logits are what is compared here)."""
    import torch

    from wide_export.bench.llamacpp import LlamaCppModel
    from wide_export.export.gguf import write_gguf

    folder = checkpoint(tmp_path, arch="llama", tie_word_embeddings=True)
    write_gguf(folder, tmp_path / "m.gguf", dtype)
    ids = prompt()
    with torch.no_grad():
        want = transformers_model(folder)(torch.tensor([ids])).logits[0, -1].numpy()
    with LlamaCppModel(tmp_path / "m.gguf", seq_tokens=64, n_threads=2, kv_type="f32", flash_attn=False) as m:
        m.generate([ids], 1)
        got = m.logits(-1)
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err < tol, err


@pytest.mark.llamacpp
def test_llama_cpp_reads_the_gpt2_vocabulary(tmp_path):
    """A byte-level BPE tokenizer.json becomes a vocabulary llama.cpp loads: same size, and its tokenizer
    agrees with Hugging Face's on plain text."""
    import llama_cpp

    from tests.export.test_gguf import byte_level_bpe
    from wide_export.export.gguf import write_gguf

    folder = checkpoint(tmp_path, arch="llama")
    fast = byte_level_bpe(folder)
    write_gguf(folder, tmp_path / "m.gguf")
    llm = llama_cpp.Llama(str(tmp_path / "m.gguf"), vocab_only=True, verbose=False)
    try:
        assert llm.n_vocab() == SPEC["vocab_size"]
        text = "the quick brown fox jumps over the lazy dog"
        assert llm.tokenize(text.encode(), add_bos=False) == fast.encode(text, add_special_tokens=False)
        ids = fast.encode(text, add_special_tokens=False)
        assert llm.detokenize(ids).decode() == text
    finally:
        llm.close()


@pytest.mark.llamacpp
@pytest.mark.parametrize("style", ["gpt-2", "llama-bpe", "qwen2"])
def test_llama_cpp_splits_digits_and_spaces_like_hugging_face(tmp_path, style):
    """Why 12: a GPT-2 pre-tokenizer written as `llama-bpe` made llama.cpp cut '12345' into '123' + '45'
    where Hugging Face keeps it whole. Tokenizers trained with digit merges, one per pre-tokenizer: llama.cpp's
    ids for digit and space strings equal Hugging Face's."""
    import llama_cpp

    from tests.export.test_gguf import DIGITS, byte_level_bpe_of
    from wide_export.export.gguf import write_gguf

    folder = checkpoint(tmp_path, arch="llama")
    fast = byte_level_bpe_of(folder, style)
    write_gguf(folder, tmp_path / "m.gguf")
    llm = llama_cpp.Llama(str(tmp_path / "m.gguf"), vocab_only=True, verbose=False)
    try:
        for text in [*DIGITS, "12345", "a 12345 b  2024\n1999", "the 1234567 foxes"]:
            want = fast.encode(text, add_special_tokens=False)
            assert llm.tokenize(text.encode(), add_bos=False, special=False) == want, (style, text)
        if style != "qwen2":  # qwen2 splits every digit apart; the others merge digits: the split matters
            assert len(fast.encode("12345", add_special_tokens=False)) < 5
    finally:
        llm.close()


@pytest.mark.llamacpp
def test_a_damaged_file_and_bad_requests_are_one_line_errors(tmp_path):
    from wide_export.bench.llamacpp import LlamaCppModel, run_llamacpp
    from wide_export.export.gguf import write_gguf

    write_gguf(None, tmp_path / "demo.gguf")
    data = (tmp_path / "demo.gguf").read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[: len(data) // 2])
    with pytest.raises(WideError) as err:
        run_llamacpp(tmp_path / "cut.gguf", [1, 2, 3], 2)
    assert str(err.value).startswith("llama.cpp cannot load") and "\n" not in str(err.value)
    assert "not within the file bounds" in str(err.value)  # llama.cpp's own reason
    with LlamaCppModel(tmp_path / "demo.gguf", max_batch=2, seq_tokens=16, n_threads=1) as m:
        for prompts, n, what in (([[1, 2], [3]], 2, "different lengths"), ([[1, 2, 3]], 20, "do not fit"),
                                 ([[1, 999]], 2, "outside the vocabulary"), ([[1]] * 3, 2, "3 prompts")):
            with pytest.raises(WideError, match=what):
                m.generate(prompts, n)
        assert len(m.generate([[5, 6, 7], [8, 9, 10]], 4).tokens[1]) == 4  # still usable after refusals


def test_without_llama_cpp_the_benchmark_gets_one_line(monkeypatch):
    import importlib.util

    from wide_export.bench import llamacpp

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llama_cpp" else real(name, *a))
    assert not llamacpp.available()
    assert llamacpp.unavailable_reason() == ("llama.cpp rows skipped: llama-cpp-python is not installed "
                                             "(scripts/test-llamacpp.sh builds .venv-llamacpp)")
    with pytest.raises(WideError, match="llama-cpp-python is not installed"):
        llamacpp.LlamaCppModel("x.gguf")
