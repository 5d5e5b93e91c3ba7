"""The GGUF writer (wide_export/export/gguf.py) read back with the gguf library's own reader: names, shapes,
dtypes and metadata against the config; values against the checkpoint's files (LoRA merged by hand, the
q/k row order of llama.cpp's RoPE recomputed index by index, f16/bf16 rounding by numpy / ml_dtypes);
vocabularies; refusals. Needs only `gguf` (a test extra); tests/llamacpp runs the files in llama.cpp."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf", reason="the gguf package is not installed (pip install -e '.[test]')")

from wide_export.base.errors import WideError  # noqa: E402
from wide_export.export.gguf import write_gguf  # noqa: E402
from wide_export.model.synthetic import SyntheticSpec, write_checkpoint  # noqa: E402

SMALL = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4, num_kv_heads=2,
             attn_groups=2, ffn_groups=4, rank=8)


def ckpt(tmp: Path, lora: bool = False, **kw) -> Path:
    spec = SyntheticSpec(**{**SMALL, **kw})
    return write_checkpoint(tmp / "ckpt", spec, lora=lora)


def set_rope(folder: Path, **rope) -> dict:
    """config.json's RoPE parameters (transformers 5's `rope_parameters`) set to `rope`; returns the config."""
    cfg = json.loads((folder / "config.json").read_text())
    cfg["rope_parameters"] = {"rope_theta": 10000.0, **rope}
    (folder / "config.json").write_text(json.dumps(cfg))
    return cfg


def read(path: Path):
    reader = gguf.GGUFReader(str(path))
    meta = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    tensors = {t.name: t for t in reader.tensors}
    return meta, tensors


def values(t) -> np.ndarray:
    """A tensor of the file as float32, numpy order ([rows, cols])."""
    data = np.asarray(t.data)
    if t.tensor_type == gguf.GGMLQuantizationType.BF16:
        bits = data.view(np.uint16).astype(np.uint32) << 16
        return bits.view(np.float32).reshape(data.shape[0], -1)
    return data.astype(np.float32)


def hf_state(folder: Path, lora: bool = False, scale: float = 2.0) -> dict[str, np.ndarray]:
    """The checkpoint's base tensors in float32, LoRA merged by hand (W + B @ A * scale)."""
    import torch
    from safetensors.numpy import load_file

    state = {k: v.astype(np.float32) for k, v in load_file(str(folder / "model.safetensors")).items()}
    if lora:
        pairs: dict[str, dict[str, np.ndarray]] = {}
        for key, tensor in torch.load(folder / "lora.pth", weights_only=True).items():
            base, ab = key[key.index("model.layers."):].rsplit(".lora_", 1)  # PEFT prefix stripped
            pairs.setdefault(base + ".weight", {})[ab[0]] = tensor.float().numpy()
        for name, p in pairs.items():
            state[name] = state[name] + (p["B"] @ p["A"]) * scale
    return state


def pairwise_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's q/k row order computed index by index: row h*d + 2i + j of the file is row
    h*d + j*d/2 + i of the checkpoint."""
    d = w.shape[0] // heads
    out = np.empty_like(w)
    for h in range(heads):
        for i in range(d // 2):
            for j in (0, 1):
                out[h * d + 2 * i + j] = w[h * d + j * d // 2 + i]
    return out


def test_llama_names_shapes_metadata_and_merged_values(tmp_path):
    folder = ckpt(tmp_path, lora=True, attention_bias=True)
    out = tmp_path / "m.gguf"
    result = write_gguf(folder, out, lora=folder / "lora.pth")
    assert (result.arch, result.dtype, result.lora_pairs, result.path) == ("llama", "f32", 8, out.absolute())
    meta, tensors = read(out)
    cfg = json.loads((folder / "config.json").read_text())
    d = cfg["hidden_size"] // cfg["num_attention_heads"]
    assert meta["general.architecture"] == "llama"
    expect = {"llama.context_length": cfg["max_position_embeddings"], "llama.embedding_length": cfg["hidden_size"],
              "llama.block_count": cfg["num_hidden_layers"], "llama.feed_forward_length": cfg["intermediate_size"],
              "llama.attention.head_count": cfg["num_attention_heads"],
              "llama.attention.head_count_kv": cfg["num_key_value_heads"], "llama.attention.key_length": d,
              "llama.attention.value_length": d, "llama.rope.dimension_count": d, "llama.vocab_size": 300,
              "general.file_type": int(gguf.LlamaFileType.ALL_F32)}
    assert {k: meta[k] for k in expect} == expect
    assert meta["llama.attention.layer_norm_rms_epsilon"] == pytest.approx(cfg["rms_norm_eps"])
    assert meta["llama.rope.freq_base"] == pytest.approx(cfg["rope_parameters"]["rope_theta"])
    assert meta["tokenizer.ggml.model"] == "none"  # no tokenizer.json in a synthetic folder
    assert not any(k.startswith("llama.rope.scaling") for k in meta)

    names = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
             "output.weight": "lm_head.weight"}
    for i in range(2):
        b, s = f"blk.{i}.", f"model.layers.{i}."
        names.update({b + "attn_norm.weight": s + "input_layernorm.weight",
                      b + "ffn_norm.weight": s + "post_attention_layernorm.weight",
                      b + "attn_output.weight": s + "self_attn.o_proj.weight",
                      b + "attn_output.bias": s + "self_attn.o_proj.bias",
                      b + "ffn_gate.weight": s + "mlp.gate_proj.weight", b + "ffn_up.weight": s + "mlp.up_proj.weight",
                      b + "ffn_down.weight": s + "mlp.down_proj.weight"})
        for ours, theirs in (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v")):
            names.update({f"{b}{theirs}.{p}": f"{s}self_attn.{ours}.{p}" for p in ("weight", "bias")})
    assert set(tensors) == set(names)  # no router tensor, nothing else
    state = hf_state(folder, lora=True)
    heads = {"attn_q": cfg["num_attention_heads"], "attn_k": cfg["num_key_value_heads"]}
    for name, src in names.items():
        t = tensors[name]
        assert t.tensor_type == gguf.GGMLQuantizationType.F32, name
        assert list(t.shape) == list(reversed(state[src].shape)), name  # ggml order: columns first
        want = state[src]
        kind = name.split(".")[-2]
        if kind in heads:  # RoPE pairs: reordered rows (weight and bias)
            want = pairwise_rows(want, heads[kind])
        np.testing.assert_array_equal(values(t).reshape(want.shape), want, err_msg=name)


def test_the_permutation_is_not_the_identity_and_is_undone_by_the_hand_inverse(tmp_path):
    folder = ckpt(tmp_path)
    write_gguf(folder, tmp_path / "m.gguf")
    _, tensors = read(tmp_path / "m.gguf")
    q = values(tensors["blk.0.attn_q.weight"])
    hf = hf_state(folder)["model.layers.0.self_attn.q_proj.weight"]
    assert not np.array_equal(q, hf)
    heads, d = SMALL["num_heads"], SMALL["hidden_size"] // SMALL["num_heads"]
    back = np.empty_like(q)
    for h in range(heads):
        for r in range(d):
            j, i = divmod(r, d // 2)  # checkpoint row h*d + r = j*d/2 + i sits at file row h*d + 2i + j
            back[h * d + r] = q[h * d + 2 * i + j]
    np.testing.assert_array_equal(back, hf)


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_qwen_keeps_the_rows_and_writes_its_own_tensors(tmp_path, arch):
    folder = ckpt(tmp_path, arch=arch, head_dim=32)  # qwen3: head_dim != hidden / heads
    result = write_gguf(folder, tmp_path / "m.gguf")
    meta, tensors = read(tmp_path / "m.gguf")
    assert result.arch == arch == meta["general.architecture"]
    assert meta[f"{arch}.attention.key_length"] == meta[f"{arch}.attention.value_length"] == 32
    state = hf_state(folder)
    for i in range(2):
        for ours, theirs in (("q_proj", "attn_q"), ("k_proj", "attn_k")):  # NeoX RoPE in llama.cpp too
            np.testing.assert_array_equal(values(tensors[f"blk.{i}.{theirs}.weight"]),
                                          state[f"model.layers.{i}.self_attn.{ours}.weight"])
    norms = {n for n in tensors if n.endswith(("attn_q_norm.weight", "attn_k_norm.weight"))}
    biases = {n for n in tensors if n.endswith(".bias")}
    if arch == "qwen3":
        assert len(norms) == 4 and not biases
        np.testing.assert_array_equal(values(tensors["blk.1.attn_k_norm.weight"]),
                                      state["model.layers.1.self_attn.k_norm.weight"])
    else:  # qwen2: q/k/v biases, no o bias, no q/k norm
        assert not norms and biases == {f"blk.{i}.attn_{p}.bias" for i in range(2) for p in "qkv"}


def test_tied_embeddings_have_no_output_tensor(tmp_path):
    folder = ckpt(tmp_path, tie_word_embeddings=True)
    write_gguf(folder, tmp_path / "m.gguf")
    _, tensors = read(tmp_path / "m.gguf")
    assert "output.weight" not in tensors and "token_embd.weight" in tensors


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_half_precision_is_the_float32_weights_rounded(tmp_path, dtype):
    import ml_dtypes

    folder = ckpt(tmp_path, arch="qwen3")
    write_gguf(folder, tmp_path / "m.gguf", dtype)
    meta, tensors = read(tmp_path / "m.gguf")
    kind = {"f16": gguf.GGMLQuantizationType.F16, "bf16": gguf.GGMLQuantizationType.BF16}[dtype]
    rounded = {"f16": np.float16, "bf16": ml_dtypes.bfloat16}[dtype]
    state = hf_state(folder)
    pairs = {"token_embd.weight": "model.embed_tokens.weight", "blk.1.ffn_down.weight": "model.layers.1.mlp.down_proj.weight",
             "blk.0.attn_q.weight": "model.layers.0.self_attn.q_proj.weight", "output.weight": "lm_head.weight"}
    for name, src in pairs.items():
        assert tensors[name].tensor_type == kind, name
        want = state[src].astype(rounded).astype(np.float32)
        assert not np.array_equal(want, state[src])  # the rounding is visible
        np.testing.assert_array_equal(values(tensors[name]).reshape(want.shape), want, err_msg=name)
    assert tensors["blk.0.attn_norm.weight"].tensor_type == gguf.GGMLQuantizationType.F32  # 1-D stays f32
    assert tensors["blk.0.attn_q_norm.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    ftype = {"f16": gguf.LlamaFileType.MOSTLY_F16, "bf16": gguf.LlamaFileType.MOSTLY_BF16}[dtype]
    assert meta["general.file_type"] == int(ftype)


def test_a_loaded_model_and_its_folder_give_the_same_tensors(tmp_path):
    from wide_export.checkpoint import load_wide_model

    folder = ckpt(tmp_path, lora=True)
    write_gguf(folder, tmp_path / "lazy.gguf", lora=folder / "lora.pth")
    write_gguf(load_wide_model(folder, lora=folder / "lora.pth"), tmp_path / "eager.gguf")  # eager loader
    _, a = read(tmp_path / "lazy.gguf")
    _, b = read(tmp_path / "eager.gguf")
    assert list(a) == list(b)
    for name in a:
        np.testing.assert_array_equal(values(a[name]), values(b[name]), err_msg=name)


def test_the_demo_model_is_written(tmp_path):
    result = write_gguf(None, tmp_path / "demo.gguf", "f16")
    meta, tensors = read(tmp_path / "demo.gguf")
    assert result.vocab == "none (ids only)" and "demo model has no tokenizer" in result.notes[0]
    assert meta["llama.block_count"] == 3 and "output.weight" in tensors
    assert "wide-demo" in meta["general.name"]


def test_llama3_rope_becomes_rope_freqs_and_linear_a_scaling_factor(tmp_path):
    import torch
    import transformers

    folder = ckpt(tmp_path, num_heads=2, num_kv_heads=1)  # head_dim 32
    cfg = set_rope(folder, rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=64)
    write_gguf(folder, tmp_path / "l3.gguf")
    meta, tensors = read(tmp_path / "l3.gguf")
    factors = values(tensors["rope_freqs.weight"]).ravel()
    # transformers' own llama3 frequencies: llama.cpp divides base^(-2i/d) by the factors
    rotary = transformers.LlamaConfig(**cfg)
    inv = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(rotary).inv_freq.float()
    base = 1.0 / (10000.0 ** (torch.arange(0, 32, 2).float() / 32))
    np.testing.assert_allclose(factors, (base / inv).numpy(), rtol=1e-6)
    assert factors.min() == pytest.approx(1.0) and factors.max() == pytest.approx(8.0)  # both ends present

    set_rope(folder, rope_type="linear", factor=4.0)
    write_gguf(folder, tmp_path / "lin.gguf")
    meta, tensors = read(tmp_path / "lin.gguf")
    assert "rope_freqs.weight" not in tensors
    assert meta["llama.rope.scaling.type"] == "linear" and meta["llama.rope.scaling.factor"] == pytest.approx(4.0)


# ---- vocabularies ---------------------------------------------------------------------------------------

CORPUS = ["the quick brown fox jumps over the lazy dog", "hello world, hello there", "a b c d e f g"] * 20


def byte_level_bpe(folder: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=290, special_tokens=["<|bos|>", "<|eos|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|eos|>")
    fast.save_pretrained(str(folder))
    return fast


def test_a_byte_level_bpe_becomes_a_gpt2_vocabulary_with_merges(tmp_path):
    folder = ckpt(tmp_path)
    fast = byte_level_bpe(folder)
    result = write_gguf(folder, tmp_path / "m.gguf")
    meta, _ = read(tmp_path / "m.gguf")
    # GPT-2's own pre-tokenizer (ByteLevel's built-in regex): llama.cpp's `gpt-2`, whatever the family
    assert result.vocab == "gpt2 (tokenizer.json, pre-tokenizer gpt-2)" and not result.notes
    assert meta["tokenizer.ggml.model"] == "gpt2" and meta["tokenizer.ggml.pre"] == "gpt-2"
    tokens = meta["tokenizer.ggml.tokens"]
    n = len(fast)
    assert len(tokens) == 300  # the model's vocabulary: ids past the tokenizer's are padding
    assert tokens[:n] == fast.convert_ids_to_tokens(list(range(n)))
    assert tokens[n:] == [f"[PAD{i}]" for i in range(n, 300)]
    types = meta["tokenizer.ggml.token_type"]
    assert types[0] == types[1] == int(gguf.TokenType.CONTROL)  # the special tokens
    assert types[5] == int(gguf.TokenType.NORMAL) and types[n] == int(gguf.TokenType.UNUSED)
    merges = json.loads((folder / "tokenizer.json").read_text())["model"]["merges"]
    assert len(merges) > 10 and len(meta["tokenizer.ggml.merges"]) == len(merges)
    assert meta["tokenizer.ggml.bos_token_id"] == 0 and meta["tokenizer.ggml.eos_token_id"] == 1


# The pre-tokenizers of tokenizer.json as the families write them, and the name llama.cpp gives each
# (src/llama-vocab.cpp, whose comments quote these regexes from the models' tokenizer.json).
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")
DIGITS = ["12345", " 12345", "2024 and 1999", "a1b22c333d4444", "x 7 77 777 7777 77777"]


def pre_tokenizer(style: str):
    from tokenizers import Regex, pre_tokenizers

    if style == "gpt-2":
        return pre_tokenizers.ByteLevel(add_prefix_space=False)
    if style == "prefix-space":  # GPT-2's regex after a leading space llama.cpp never adds: no llama.cpp name
        return pre_tokenizers.ByteLevel(add_prefix_space=True)
    regex = {"llama-bpe": LLAMA3_REGEX, "qwen2": QWEN2_REGEX, "custom": r"\p{N}{1,2}|[^\p{N}]+"}[style]
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(regex), behavior="isolated"),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def byte_level_bpe_of(folder: Path, style: str, vocab_size: int = 480):
    """A byte-level BPE trained with the pre-tokenizer `style` (a corpus with numbers: digit merges)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer(style)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|bos|>", "<|eos|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS + DIGITS * 20 + ["12345 123 45 2024 1999 12 345"] * 20, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|eos|>")
    fast.save_pretrained(str(folder))
    return fast


@pytest.mark.parametrize("style,arch", [("gpt-2", "qwen2"), ("llama-bpe", "llama"), ("llama-bpe", "qwen3"),
                                        ("qwen2", "qwen2"), ("qwen2", "llama")])
def test_the_pre_tokenizer_is_named_from_tokenizer_json_not_the_family(tmp_path, style, arch):
    """Why 12: a GPT-2 pre-tokenizer was written `llama-bpe` for a llama model (digits split into threes by
    llama.cpp, kept whole by Hugging Face). The name follows the tokenizer's regex, whatever the family."""
    folder = ckpt(tmp_path, arch=arch, vocab_size=512)
    byte_level_bpe_of(folder, style)
    result = write_gguf(folder, tmp_path / "m.gguf")
    meta, _ = read(tmp_path / "m.gguf")
    assert meta["tokenizer.ggml.pre"] == style and result.vocab == f"gpt2 (tokenizer.json, pre-tokenizer {style})"


def test_the_demo_tokenizer_has_gpt2_s_pre_tokenizer(tmp_path):
    """The demo tokenizer (ByteLevel, GPT-2's regex) is named `gpt-2`; it has no merges, so its GGUF stays
    ids only (see test_a_bpe_without_merges_falls_back_to_ids_with_a_note)."""
    from wide_export.export.gguf_vocab import pre_tokenizer_name
    from wide_export.model.demo_tokenizer import write_demo_tokenizer

    write_demo_tokenizer(tmp_path)
    assert pre_tokenizer_name(tmp_path) == "gpt-2"


@pytest.mark.parametrize("style", ["prefix-space", "custom"])
def test_an_unknown_pre_tokenizer_is_refused_unless_named(tmp_path, style):
    folder = ckpt(tmp_path, vocab_size=512)
    byte_level_bpe_of(folder, style)
    before = listing(tmp_path)
    with pytest.raises(WideError) as err:
        write_gguf(folder, tmp_path / "m.gguf")
    text = one_line(err.value)
    assert "pre-tokenizer" in text and str(folder / "tokenizer.json") in text and "--tokenizer-pre" in text
    assert listing(tmp_path) == before
    result = write_gguf(folder, tmp_path / "m.gguf", tokenizer_pre="gpt-2")  # the user's explicit choice
    assert read(tmp_path / "m.gguf")[0]["tokenizer.ggml.pre"] == "gpt-2" and "gpt-2" in result.vocab
    write_gguf(folder, tmp_path / "ids.gguf", tokenizer_pre="none")  # or no vocabulary at all
    assert read(tmp_path / "ids.gguf")[0]["tokenizer.ggml.model"] == "none"


def test_a_known_probe_hash_wins_over_the_regex(tmp_path, monkeypatch):
    """llama.cpp's converter names a tokenizer by the sha256 of its ids for a probe text (chktxt); a hash in
    the table decides before the regex (computed here from transformers' own encode, as the converter does)."""
    import hashlib

    from transformers import AutoTokenizer

    from wide_export.export import gguf_vocab

    folder = ckpt(tmp_path, vocab_size=512)
    byte_level_bpe_of(folder, "gpt-2")
    ids = AutoTokenizer.from_pretrained(str(folder)).encode(gguf_vocab.CHKTXT)
    monkeypatch.setitem(gguf_vocab.CHKHSH, hashlib.sha256(str(ids).encode()).hexdigest(), "smollm")
    write_gguf(folder, tmp_path / "m.gguf")
    assert read(tmp_path / "m.gguf")[0]["tokenizer.ggml.pre"] == "smollm"


def spm_style_bpe(folder: Path):
    """A SentencePiece-converted BPE (Llama 2's tokenizer.json form): byte fallback, ▁ for spaces."""
    from tokenizers import Tokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    for piece in ["▁", *"abcdefghijklmnopqrstuvwxyz", "▁t", "he", "▁the"]:
        vocab[piece] = len(vocab)
    merges = [("▁", "t"), ("h", "e"), ("▁t", "he")]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(str(folder))
    return fast


def test_a_sentencepiece_style_bpe_becomes_a_llama_vocabulary(tmp_path):
    folder = ckpt(tmp_path)
    fast = spm_style_bpe(folder)
    result = write_gguf(folder, tmp_path / "m.gguf")
    meta, _ = read(tmp_path / "m.gguf")
    assert result.vocab.startswith("llama (tokenizer.json")
    assert meta["tokenizer.ggml.model"] == "llama"
    tokens, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
    n = len(fast)
    assert len(tokens) == len(meta["tokenizer.ggml.scores"]) == 300
    assert tokens[:n] == fast.convert_ids_to_tokens(list(range(n)))
    assert types[3] == types[258] == int(gguf.TokenType.BYTE)  # <0x00> .. <0xFF>
    assert types[1] == int(gguf.TokenType.CONTROL) and types[n - 1] == int(gguf.TokenType.NORMAL)
    assert meta["tokenizer.ggml.bos_token_id"] == 1


def test_a_bpe_without_merges_falls_back_to_ids_with_a_note(tmp_path):
    from wide_export.model.demo_tokenizer import write_demo_tokenizer

    folder = ckpt(tmp_path, vocab_size=256)
    write_demo_tokenizer(folder)  # byte-level, no merges: llama.cpp's BPE vocabulary needs merges
    result = write_gguf(folder, tmp_path / "m.gguf")
    meta, _ = read(tmp_path / "m.gguf")
    assert meta["tokenizer.ggml.model"] == "none" and "tokenizer.ggml.tokens" not in meta
    assert result.vocab == "none (ids only)" and "no merges" in result.notes[0]


# ---- refusals: one line, nothing left behind --------------------------------------------------------------

def listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def one_line(err: WideError) -> str:
    text = str(err)
    assert "\n" not in text and "(hint: " in text, text
    return text


def test_an_existing_output_is_refused_without_force_and_replaced_with_it(tmp_path):
    folder = ckpt(tmp_path)
    out = tmp_path / "m.gguf"
    out.write_bytes(b"old")
    with pytest.raises(WideError) as err:
        write_gguf(folder, out)
    assert "already exists" in one_line(err.value) and out.read_bytes() == b"old"
    write_gguf(folder, out, force=True)
    assert out.read_bytes()[:4] == b"GGUF"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp file left


@pytest.mark.parametrize("where", ["inside", "router", "folder"])
def test_outputs_that_would_touch_the_inputs_are_refused(tmp_path, where):
    folder = ckpt(tmp_path)
    router = (folder / "router.pth").rename(tmp_path / "router.pth")  # beside the folder, given explicitly
    before = listing(tmp_path)
    out = {"inside": folder / "m.gguf", "router": router, "folder": tmp_path}[where]
    with pytest.raises(WideError) as err:
        write_gguf(folder, out, force=True, router=router)
    text = one_line(err.value)
    assert {"inside": "is inside your input", "router": "would replace your input",
            "folder": "is a folder"}[where] in text
    assert listing(tmp_path) == before


@pytest.mark.parametrize("case", ["dtype", "qwen3-o-bias", "yarn", "model-type"])
def test_what_llama_cpp_cannot_run_is_refused_in_one_line(tmp_path, case):
    folder = ckpt(tmp_path, **({"arch": "qwen3", "attention_bias": True} if case == "qwen3-o-bias" else {}))
    if case == "yarn":
        set_rope(folder, rope_type="yarn", factor=4.0, original_max_position_embeddings=128)
    cfg = json.loads((folder / "config.json").read_text())
    if case == "model-type":
        cfg["model_type"] = "gpt2"
    (folder / "config.json").write_text(json.dumps(cfg))
    before = listing(tmp_path)
    with pytest.raises(WideError) as err:
        write_gguf(folder, tmp_path / "m.gguf", "q4_0" if case == "dtype" else "f32")
    text = one_line(err.value)
    assert {"dtype": "unsupported GGUF dtype 'q4_0'", "qwen3-o-bias": "o_proj bias",
            "yarn": "RoPE type 'yarn'", "model-type": "unsupported architecture"}[case] in text
    assert listing(tmp_path) == before


def test_a_failure_while_writing_leaves_nothing(tmp_path, monkeypatch):
    from wide_export.export import gguf as writer

    folder = ckpt(tmp_path)
    calls = []

    def broken(t, value):
        calls.append(t.name)
        if len(calls) == 5:
            raise RuntimeError("boom")
        return real(t, value)

    real = writer._array
    monkeypatch.setattr(writer, "_array", broken)
    before = listing(tmp_path)
    with pytest.raises(RuntimeError, match="boom"):
        write_gguf(folder, tmp_path / "m.gguf")
    assert listing(tmp_path) == before


def test_the_cli_writes_and_refuses_in_one_line(tmp_path):
    from typer.testing import CliRunner

    from tests.helpers import assert_one_line_error
    from wide_export.cli import get_app

    folder = ckpt(tmp_path)
    out = tmp_path / "m.gguf"
    result = CliRunner().invoke(get_app(), ["gguf", "--model", str(folder), "--out", str(out), "--dtype", "bf16"])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())  # rich wraps long lines at the console's width
    assert f"wrote {out}" in said and "llama.cpp architecture llama" in said
    assert read(out)[1]["blk.0.ffn_up.weight"].tensor_type == gguf.GGMLQuantizationType.BF16
    byte_level_bpe_of(folder, "custom", vocab_size=290)
    line = assert_one_line_error(CliRunner().invoke(get_app(), ["gguf", "--model", str(folder), "--out",
                                                                 str(tmp_path / "t.gguf")]))
    assert "--tokenizer-pre" in line, line
    result = CliRunner().invoke(get_app(), ["gguf", "--model", str(folder), "--out", str(tmp_path / "t.gguf"),
                                            "--tokenizer-pre", "qwen2"])
    assert result.exit_code == 0, result.output
    assert read(tmp_path / "t.gguf")[0]["tokenizer.ggml.pre"] == "qwen2"
    for args in (["--out", str(out)], ["--out", str(tmp_path / "x.gguf"), "--dtype", "q8"],
                 ["--out", str(folder / "x.gguf"), "--force"]):
        line = assert_one_line_error(CliRunner().invoke(get_app(), ["gguf", "--model", str(folder), *args]))
        assert any(s in line for s in ("already exists", "unsupported --dtype", "inside your input")), line
