"""A GGUF file of the dense base model, for llama.cpp: the same weights as the WIDE model, no routers.

`wide-export bench generate` puts llama.cpp's dense model next to WIDE; this writes what llama.cpp
loads. The checkpoint goes through the project's own loader (`load_wide_model`, lazily: one tensor in
memory at a time), so the LoRA is merged exactly as every other export merges it, and the routers are
validated but left out (llama.cpp has no place for them).

Layout, as llama.cpp's `convert_hf_to_gguf.py` writes a Hugging Face model of the same family:

- architecture `llama` for model_type llama and mistral, `qwen2` for qwen2, `qwen3` for qwen3;
- tensor names `token_embd`, `blk.N.attn_norm|attn_q|attn_k|attn_v|attn_output|ffn_norm|ffn_gate|ffn_up|
  ffn_down`, `blk.N.attn_q_norm|attn_k_norm` (qwen3), `output_norm`, `output` (absent when the embeddings
  are tied: llama.cpp then reuses `token_embd`), biases as `.bias` beside the weights;
- RoPE: our reference (like transformers) rotates the two halves of each head (`rotate_half`, NeoX
  layout). llama.cpp's `llama` architecture rotates adjacent pairs instead, so the rows of q_proj and
  k_proj (weights and biases) are reordered per head: row `2i + j` of a head in the file is row
  `j * head_dim / 2 + i` of the checkpoint (j = 0, 1). Its `qwen2` / `qwen3` architectures use the NeoX
  layout, and their rows are written as they are;
- matrices in the chosen dtype (f32, f16, bf16: rounded to nearest even from float32), 1-D tensors
  (norms, biases) and `rope_freqs` always float32, as llama.cpp's converter does.

Vocabulary: a `tokenizer.json` of the model folder is written as llama.cpp's converter writes it through
the `gguf` library: a byte-level BPE (Llama 3, Qwen) as `gpt2` with its merges (`gguf.vocab.BpeVocab`), a
byte-fallback BPE converted from SentencePiece (Llama 2, Mistral) as `llama` (`gguf.vocab.LlamaHfVocab`);
special tokens, add-BOS flags and the chat template through `gguf.SpecialVocab`. The pre-tokenizer name of a
byte-level BPE (llama.cpp splits text by it) is found as the converter finds it, from the hash of the ids of a
probe text, else from tokenizer.json's own pre-tokenizer (export/gguf_vocab.py); one it cannot name is refused
unless the caller names it (`tokenizer_pre`, `wide-export gguf --tokenizer-pre NAME`; `none`: ids only),
never guessed from the family. A tokenizer.json that is there but damaged is an error naming it. Without a
tokenizer (the demo and synthetic models) or with one llama.cpp cannot take (a BPE without merges, other
models than BPE) the file has a plain id vocabulary (`tokenizer.ggml.model = none` and the vocabulary size):
llama.cpp then runs on token ids only, which is all the benchmark feeds it.

Every weight is checked finite as it is written (a NaN is refused by tensor name, as is an f16 overflow).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from wide_export.base.errors import WideError
from wide_export.base.outdir import check_writable_parent

DTYPES = ("f32", "f16", "bf16")
# model_type -> llama.cpp architecture. The `llama` architecture's RoPE rotates adjacent pairs (q/k rows
# reordered), qwen2/qwen3's rotates halves like transformers.
GGUF_ARCH = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
PAIRWISE_ROPE = {"llama"}
# Which optional tensors llama.cpp's loader takes per architecture: a tensor it does not take fails the
# load ("wrong number of tensors"), so a checkpoint that needs one is refused here.
TAKES_O_BIAS = {"llama"}  # attn_output.bias (qwen2 has none by design; qwen3's loader has no slot for it)
TAKES_ROPE_FREQS = {"llama"}  # llama3 RoPE scaling as per-frequency factors
NO_VOCAB = "none"  # tokenizer_pre that writes the plain id vocabulary whatever tokenizer the folder has

Progress = Callable[[str], None]


@dataclass
class GgufResult:
    """What write_gguf wrote."""

    path: Path
    arch: str  # llama.cpp architecture
    dtype: str  # f32 | f16 | bf16 (the matrices)
    tensors: int
    bytes: int
    vocab: str  # how the vocabulary was written, e.g. "gpt2 (tokenizer.json, pre llama-bpe)" or "none (ids only)"
    lora_pairs: int = 0
    notes: list[str] = field(default_factory=list)  # e.g. why the vocabulary is ids only


def check_gguf_output(out_path: Path, force: bool = False, protect: tuple[Optional[Path], ...] = ()) -> Path:
    """Refuse a bad output file before any work: inside (or one of) the inputs, an existing file without
    `force`, a folder, a parent that cannot be written. Returns the absolute path."""
    out = Path(out_path).absolute()
    resolved = out.resolve()
    for given in filter(None, protect):
        given = Path(given).resolve()
        if given == resolved:
            raise WideError(f"output {out} would replace your input {given}", "choose an --out outside the inputs")
        if given.is_dir() and given in resolved.parents:
            raise WideError(f"output {out} is inside your input {given}",
                            "choose an --out outside the model folder (it would be written into it)")
    if out.is_dir():
        raise WideError(f"output {out} is a folder", "pass a file name, e.g. --out model.gguf")
    if os.path.lexists(out) and not force:
        raise WideError(f"output {out} already exists", "pass --force to replace it, or choose another --out")
    check_writable_parent(out, "--out")
    return out


def require_gguf() -> None:
    """A one-line WideError where the `gguf` package is missing."""
    from importlib.util import find_spec

    if find_spec("gguf") is None:
        raise WideError("the gguf package is not installed", "pip install 'gguf>=0.19' (or the project's "
                        "`llamacpp` / `test` extra: pip install -e '.[llamacpp]')")


def write_gguf(model: Any, out_path: Path | str, dtype: str = "f32", *, force: bool = False,
               router: Optional[Path] = None, lora: Optional[Path] = None, lora_scale: float = 2.0,
               progress: Optional[Progress] = None, tokenizer_pre: Optional[str] = None) -> GgufResult:
    """Write the dense base model of `model` as one GGUF file at `out_path` (atomically: a temp file beside
    it, renamed at the end; nothing is left on any error or interrupt).

    model: a Hugging Face WIDE checkpoint folder (loaded with `router`, `lora`, `lora_scale` as
    `load_wide_model` does), a `LoadedModel` (already loaded: router/lora must not be given), or None for
    the embedded demo model. dtype: "f32", "f16" or "bf16" for the matrices. force: replace an existing
    file. tokenizer_pre: llama.cpp's pre-tokenizer name for a byte-level BPE tokenizer.json (None: identified
    from the tokenizer, refused where it cannot be), or "none" for the plain id vocabulary.
    """
    say = progress or (lambda _msg: None)
    require_gguf()
    if dtype not in DTYPES:
        raise WideError(f"unsupported GGUF dtype {dtype!r}", f"choose one of {', '.join(DTYPES)}")
    if tokenizer_pre is not None and not _pre_name_ok(tokenizer_pre):
        raise WideError(f"--tokenizer-pre {tokenizer_pre!r} is not a pre-tokenizer name",
                        "a name llama.cpp knows (gpt-2, llama-bpe, qwen2, ...) or none for an id vocabulary")
    from wide_export.checkpoint.loader import LoadedModel

    if isinstance(model, LoadedModel):
        if router is not None or lora is not None:
            raise WideError("router/lora given with an already loaded model",
                            "pass the model folder to write_gguf, or load it with its router and LoRA first")
        loaded = model
        protect = (loaded.model_dir,)
    else:
        model_dir = None if model is None else Path(model)
        protect = (model_dir, router, lora)
        check_gguf_output(Path(out_path), force, protect)  # before minutes of loading
        if model_dir is not None:
            from wide_export.checkpoint.hf import read_hf_config

            _arch_of(read_hf_config(model_dir).model_type)  # refuse before reading the weights
        from wide_export.checkpoint import load_wide_model

        say("opening the checkpoint")
        loaded = load_wide_model(model_dir, router=router, lora=lora, lora_scale=lora_scale, dtype="float32",
                                 lazy=True, checksums=False, progress=say)
    out = check_gguf_output(Path(out_path), force, protect)
    plan = _plan(loaded, dtype)
    vocab = _vocabulary_plan(loaded, tokenizer_pre)  # refused before the temp file is made
    return _write(plan, vocab, loaded, out, force, say)


# ---- the plan: every tensor, its name, shape and dtype, and the metadata ----------------------------------

@dataclass
class _Tensor:
    name: str  # GGUF name
    source: Optional[str]  # our parameter name (None: generated, see `make`)
    shape: tuple[int, ...]  # numpy order ([out, in] for a matrix)
    dtype: str  # f32 | f16 | bf16
    permute_heads: int = 0  # >0: reorder rows per head of this many heads (RoPE pairs, see module doc)
    make: Optional[Callable[[], Any]] = None  # generated tensor (torch)


@dataclass
class _Plan:
    arch: str
    dtype: str
    tensors: list[_Tensor]
    rope_scaling: Optional[tuple[str, float]]  # ("linear", factor) or None


def _arch_of(model_type: str) -> str:
    from wide_export.model.arch import ARCHS

    if model_type not in GGUF_ARCH:  # every row of the table has an entry; a new row must add one
        raise WideError(f"model_type {model_type!r} has no llama.cpp architecture in the GGUF writer",
                        f"the GGUF writer supports {', '.join(sorted(GGUF_ARCH))}"
                        + ("" if model_type in ARCHS else " (and wide-export does not support it either)"))
    return GGUF_ARCH[model_type]


def _plan(loaded, dtype: str) -> _Plan:
    cfg = loaded.config
    arch = _arch_of(cfg.model_type)
    if cfg.o_bias and arch not in TAKES_O_BIAS:
        raise WideError(f"a {cfg.model_type} checkpoint with an o_proj bias (attention_bias=true) cannot be "
                        f"written for llama.cpp", f"llama.cpp's {arch} architecture has no attn_output bias")
    rope_scaling, rope_freqs = _rope(loaded, arch)
    pairs = arch in PAIRWISE_ROPE
    t: list[_Tensor] = [_Tensor("token_embd.weight", "model.embed_tokens.weight",
                                (cfg.vocab_size, cfg.hidden_size), dtype)]
    if rope_freqs is not None:
        t.append(_Tensor("rope_freqs.weight", None, tuple(rope_freqs.shape), "f32", make=lambda: rope_freqs))
    d, hq, hkv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    h, ff = cfg.hidden_size, cfg.intermediate_size
    for i in range(cfg.num_layers):
        src = f"model.layers.{i}."
        blk = f"blk.{i}."
        t.append(_Tensor(blk + "attn_norm.weight", src + "input_layernorm.weight", (h,), "f32"))
        for ours, theirs, rows, heads in (("q_proj", "attn_q", hq * d, hq), ("k_proj", "attn_k", hkv * d, hkv),
                                          ("v_proj", "attn_v", hkv * d, 0)):
            perm = heads if pairs else 0
            t.append(_Tensor(f"{blk}{theirs}.weight", f"{src}self_attn.{ours}.weight", (rows, h), dtype, perm))
            if cfg.qkv_bias:
                t.append(_Tensor(f"{blk}{theirs}.bias", f"{src}self_attn.{ours}.bias", (rows,), "f32", perm))
        t.append(_Tensor(blk + "attn_output.weight", src + "self_attn.o_proj.weight", (h, hq * d), dtype))
        if cfg.o_bias:
            t.append(_Tensor(blk + "attn_output.bias", src + "self_attn.o_proj.bias", (h,), "f32"))
        if cfg.qk_norm:
            t.append(_Tensor(blk + "attn_q_norm.weight", src + "self_attn.q_norm.weight", (d,), "f32"))
            t.append(_Tensor(blk + "attn_k_norm.weight", src + "self_attn.k_norm.weight", (d,), "f32"))
        t.append(_Tensor(blk + "ffn_norm.weight", src + "post_attention_layernorm.weight", (h,), "f32"))
        t.append(_Tensor(blk + "ffn_gate.weight", src + "mlp.gate_proj.weight", (ff, h), dtype))
        t.append(_Tensor(blk + "ffn_up.weight", src + "mlp.up_proj.weight", (ff, h), dtype))
        t.append(_Tensor(blk + "ffn_down.weight", src + "mlp.down_proj.weight", (h, ff), dtype))
    t.append(_Tensor("output_norm.weight", "model.norm.weight", (h,), "f32"))
    if not cfg.tie_word_embeddings:
        t.append(_Tensor("output.weight", "lm_head.weight", (cfg.vocab_size, h), dtype))
    return _Plan(arch, dtype, t, rope_scaling)


def _rope(loaded, arch: str):
    """(("linear", factor) or None, rope_freqs tensor or None) making llama.cpp's RoPE frequencies ours.

    Our frequencies are the family's transformers rotary embedding's (model.inv_freq); llama.cpp computes
    base^(-2i/d) and divides by a per-frequency factor (`rope_freqs`, how the converter writes llama3
    scaling) or by a linear scale (`rope.scaling.type linear`)."""
    import torch

    cfg, m = loaded.config, loaded.model.model
    rope = dict(cfg.rope)
    kind, theta = rope.get("rope_type", "default"), float(rope.get("rope_theta", 10000.0))
    if float(m.rope_scaling) != 1.0:
        raise WideError(f"RoPE type {kind!r} scales attention by {float(m.rope_scaling):.4g}, which the GGUF "
                        "writer does not carry over", "llama.cpp's equivalent (YaRN) is not written; supported: "
                        "default, linear, llama3 (llama/mistral)")
    d = cfg.head_dim
    base = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    ours = m.inv_freq.float()
    if kind == "default":
        return None, None
    if kind == "linear":
        return ("linear", float(rope["factor"])), None
    if kind == "llama3" and arch in TAKES_ROPE_FREQS:
        return None, (base / ours).float().contiguous()
    raise WideError(f"RoPE type {kind!r} of a {cfg.model_type} checkpoint cannot be written for llama.cpp",
                    "supported: default, linear, llama3 (llama/mistral)")


# ---- writing ----------------------------------------------------------------------------------------------

def _getter(loaded) -> Callable[[str], Any]:
    if loaded.weights is not None:  # lazy: read, cast and LoRA-merge one tensor at a time
        return loaded.weights.tensor
    params = dict(loaded.model.named_parameters(remove_duplicate=False))
    return lambda name: params[name].detach()


def permute_rope_rows(w, heads: int):
    """Rows of q/k (weight [heads*d, in] or bias [heads*d]) from the half-split RoPE layout of transformers
    to llama.cpp's adjacent-pair layout: within each head, row 2i + j of the result is row j*d/2 + i."""
    rest = tuple(w.shape[1:])
    d = w.shape[0] // heads
    return w.reshape(heads, 2, d // 2, *rest).transpose(1, 2).reshape(w.shape)


def _array(t: _Tensor, value):
    """The numpy array of a tensor as the file holds it (bf16 as its int16 bit patterns)."""
    import torch

    value = value.detach().to("cpu").float()
    if tuple(value.shape) != t.shape:
        raise WideError(f"{t.source}: shape {list(value.shape)}, expected {list(t.shape)}",
                        "config.json does not match the weights")
    if not bool(torch.isfinite(value).all()):
        raise WideError(f"weight {t.source or t.name} holds NaN or infinite values",
                        "the checkpoint is damaged or its training diverged: use another checkpoint")
    if t.permute_heads:
        value = permute_rope_rows(value, t.permute_heads)
    value = value.contiguous()
    if t.dtype == "f32":
        return value.numpy()
    if t.dtype == "f16":
        half = value.to(torch.float16)
        if not bool(torch.isfinite(half).all()):
            raise WideError(f"weight {t.source or t.name} exceeds float16's range (65504)",
                            "write --dtype bf16 or f32")
        return half.numpy()
    return value.to(torch.bfloat16).view(torch.int16).numpy()  # round to nearest even, as gguf's own


def _np_dtype(t: _Tensor):
    import numpy as np

    return {"f32": np.float32, "f16": np.float16, "bf16": np.int16}[t.dtype]


def _write(plan: _Plan, vocab_plan: "_Vocab", loaded, out: Path, force: bool, say: Progress) -> GgufResult:
    import gguf
    import numpy as np

    from wide_export.base.outdir import _disk_full, rename_noreplace
    from wide_export.base.signals import check_interrupted, mark_published, shielded, signals_deferred

    out.parent.mkdir(parents=True, exist_ok=True)
    with shielded():
        fd, tmp_name = tempfile.mkstemp(prefix=f".{out.name}.tmp-", dir=out.parent)
        os.close(fd)
    tmp = Path(tmp_name)
    notes: list[str] = []
    writer = None
    try:
        check_interrupted()
        writer = gguf.GGUFWriter(str(tmp), plan.arch)
        _metadata(writer, plan, loaded)
        vocab = _vocabulary(writer, vocab_plan, loaded.config, notes)
        raw_types = {"bf16": gguf.GGMLQuantizationType.BF16}
        for t in plan.tensors:
            nbytes = int(np.prod(t.shape)) * np.dtype(_np_dtype(t)).itemsize
            writer.add_tensor_info(t.name, t.shape, np.dtype(_np_dtype(t)), nbytes, raw_dtype=raw_types.get(t.dtype))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        get = _getter(loaded)
        for k, t in enumerate(plan.tensors, 1):
            check_interrupted()
            writer.write_tensor_data(_array(t, t.make() if t.make is not None else get(t.source)))
            say(f"tensors {k}/{len(plan.tensors)}")
        writer.close()
        writer = None
        os.chmod(tmp, 0o666 & ~_umask())
        with signals_deferred():
            check_interrupted()
            if force:
                os.replace(tmp, out)
            else:
                try:
                    rename_noreplace(tmp, out)
                except FileExistsError:
                    raise WideError(f"output {out} appeared while this run was writing it (another run?); it "
                                    "was left as it is", "pass --force to replace it, or choose another --out") from None
            mark_published(out)
    except BaseException as err:
        if writer is not None:
            with contextlib.suppress(Exception):
                writer.close()
        with contextlib.suppress(OSError):
            tmp.unlink()
        full = _disk_full(err) if isinstance(err, Exception) else None
        if full is not None:
            raise WideError(f"disk full while writing {out}: {full.strerror or full}",
                            "free some space, or choose an --out on another disk; nothing was written") from None
        raise
    return GgufResult(out, plan.arch, plan.dtype, len(plan.tensors), out.stat().st_size, vocab,
                      loaded.lora_pairs, notes)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _metadata(w, plan: _Plan, loaded) -> None:
    import gguf

    cfg = loaded.config
    if loaded.is_demo:
        from wide_export.model.demo import DEMO_NAME

        name = DEMO_NAME
    else:
        name = Path(loaded.model_dir).resolve().name if loaded.model_dir else "wide-model"
    w.add_name(name)
    w.add_description("dense base model of a WIDE checkpoint (routers not included"
                      + (f"; LoRA merged: {loaded.lora_pairs} pairs, scale {loaded.lora_scale}" if loaded.lora_pairs
                         else "") + "), written by wide-export")
    w.add_context_length(int(cfg.max_position_embeddings))
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_rope_freq_base(float(cfg.rope.get("rope_theta", 10000.0)))
    if plan.rope_scaling is not None:
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(plan.rope_scaling[1])
    w.add_layer_norm_rms_eps(float(cfg.rms_norm_eps))
    w.add_vocab_size(cfg.vocab_size)
    w.add_file_type({"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                     "bf16": gguf.LlamaFileType.MOSTLY_BF16}[plan.dtype])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)


@dataclass
class _Vocab:
    """The vocabulary to write: from tokenizer.json (`folder`, with `pre` for a byte-level BPE), or ids only
    (`why`)."""

    folder: Optional[Path] = None
    tokens: Optional[list] = None  # (text, score, type) of gguf.vocab's BpeVocab / LlamaHfVocab
    kind: str = ""  # gpt2 | llama
    special: Any = None  # gguf.SpecialVocab of the folder (merges loaded for gpt2)
    pre: str = "default"
    why: str = ""


def _vocabulary_plan(loaded, tokenizer_pre: Optional[str]) -> _Vocab:
    """Read and check the folder's tokenizer before anything is written (see the module docstring)."""
    from wide_export.checkpoint.text import TOKENIZER_FILE, read_fast_tokenizer

    model_dir = loaded.model_dir
    if model_dir is None:
        return _Vocab(why="the demo model has no tokenizer file")
    if tokenizer_pre == NO_VOCAB:
        return _Vocab(why="--tokenizer-pre none")
    path = Path(model_dir) / TOKENIZER_FILE
    if not path.is_file():
        return _Vocab(why=f"{model_dir} has no {TOKENIZER_FILE}")
    read_fast_tokenizer(path)  # a damaged file is an error naming it, not "no tokenizer"
    try:
        found = _tokenizer_json(Path(model_dir), loaded.config)
    except _NoVocab as err:
        return _Vocab(why=str(err))
    if found.kind == "gpt2":
        from wide_export.export.gguf_vocab import pre_tokenizer_name

        found.pre = tokenizer_pre or pre_tokenizer_name(Path(model_dir)) or ""
        if not found.pre:
            raise WideError(f"llama.cpp has no pre-tokenizer known to match {path}: its text would be split "
                            "differently from Hugging Face's",
                            "name the one llama.cpp should use with --tokenizer-pre NAME (as llama.cpp's "
                            "convert_hf_to_gguf.py names it), or --tokenizer-pre none for token ids only")
    return found


def _pre_name_ok(name: str) -> bool:
    import re

    return re.fullmatch(r"[a-z0-9][a-z0-9._-]{0,63}", name) is not None


def _vocabulary(w, plan: _Vocab, cfg, notes: list[str]) -> str:
    """Write the tokenizer keys; returns how (see the module docstring)."""
    if plan.tokens is None:
        w.add_tokenizer_model("none")
        notes.append(f"plain id vocabulary ({plan.why}): llama.cpp runs on token ids only")
        return "none (ids only)"
    import gguf

    tokens, scores, types = [], [], []
    for text, score, kind_ in plan.tokens:
        tokens.append(text)
        scores.append(score)
        types.append(kind_)
    _mark_special(plan.folder, types)
    for i in range(len(tokens), cfg.vocab_size):  # embedding rows beyond the tokenizer: unused, as the converter
        tokens.append(f"[PAD{i}]")
        scores.append(-1000.0)
        types.append(gguf.TokenType.UNUSED)
    w.add_tokenizer_model(plan.kind)
    w.add_tokenizer_pre(plan.pre)
    w.add_token_list(tokens)
    if plan.kind == "llama":
        w.add_token_scores(scores)
    w.add_token_types([int(x) for x in types])
    plan.special.add_to_gguf(w, quiet=True)
    return f"{plan.kind} (tokenizer.json, pre-tokenizer {plan.pre})"


class _NoVocab(Exception):
    """tokenizer.json cannot be written as a llama.cpp vocabulary (the reason)."""


def _tokenizer_json(folder: Path, cfg) -> _Vocab:
    import gguf
    from gguf.vocab import BpeVocab, LlamaHfVocab

    vocab, kind = None, None
    for cls in (BpeVocab, LlamaHfVocab):
        try:
            vocab = cls(folder)
            kind = cls.tokenizer_model
            break
        except (OSError, TypeError, ValueError, KeyError, ImportError):  # not this kind
            continue
    if vocab is None:
        raise _NoVocab("its tokenizer.json is neither a byte-level BPE nor a SentencePiece-style BPE")
    tokens = list(vocab.all_tokens())
    if len(tokens) > cfg.vocab_size:
        raise _NoVocab(f"its tokenizer has {len(tokens)} tokens, more than the model's {cfg.vocab_size}")
    special = gguf.SpecialVocab(folder, load_merges=kind == "gpt2", n_vocab=cfg.vocab_size)
    if kind == "gpt2" and not special.merges:
        raise _NoVocab("its BPE tokenizer has no merges, which llama.cpp's BPE vocabulary needs")
    return _Vocab(folder=folder, tokens=tokens, kind=kind, special=special)


def _mark_special(folder: Path, types: list) -> None:
    """Added tokens flagged special in tokenizer.json are CONTROL tokens, also where they are part of the base
    vocabulary (gguf's BpeVocab types only tokens beyond it)."""
    import gguf

    from wide_export.base.paths import read_json

    raw = read_json(folder / "tokenizer.json", hint="the tokenizer file looks damaged")
    for item in raw.get("added_tokens") or []:
        tid = item.get("id") if isinstance(item, dict) else None
        if isinstance(tid, int) and 0 <= tid < len(types) and item.get("special"):
            types[tid] = gguf.TokenType.CONTROL
