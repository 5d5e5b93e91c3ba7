"""Which llama.cpp pre-tokenizer (`tokenizer.ggml.pre`) a byte-level BPE tokenizer.json has, or None.

llama.cpp does not read the pre-tokenizer from the file: it re-implements each one it knows (regexes in
src/llama-vocab.cpp) and picks it by this name, so a wrong name splits text differently from Hugging Face
(GPT-2's regex keeps "12345" whole, `llama-bpe` cuts digits into threes). The name is found as llama.cpp's
converter finds it, then from the tokenizer.json itself; never guessed from the model family:

1. the sha256 of the ids the tokenizer gives a probe text (CHKTXT), looked up in CHKHSH: the converter's
   `get_vocab_base_pre` (convert_hf_to_gguf.py, ggml-org/llama.cpp), for the released tokenizers of the
   families wide-export writes (llama, mistral, qwen2, qwen3);
2. the pre-tokenizer of tokenizer.json, where it is exactly one llama.cpp implements: ByteLevel with its
   built-in regex (`gpt-2`), or a Split on the Llama 3 (`llama-bpe`) or Qwen2 (`qwen2`) regex before a
   ByteLevel without regex, no normalizer (NFC for qwen2, as Qwen's own).

Anything else is None, and the writer refuses it unless the user names the pre-tokenizer.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Optional

# convert_hf_to_gguf.py's probe text (`chktxt` in get_vocab_base_pre), as it is there.
CHKTXT = (
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n\U0001f680 (normal) \U0001f636\u200d\U0001f32b\ufe0f "
    "(multiple emojis concatenated) \u2705 \U0001f999\U0001f999 3 33 333 3333 33333 333333 3333333 33333333 3.3 "
    "3..3 3...3 \u1780\u17b6\u1793\u17cb\u178f\u17c2\u1796\u17b7\u179f\u17c1\u179f\u17a2\u17b6\u1785\U0001f601 "
    "?\u6211\u60f3\u5728apple\u5de5\u4f5c1314151\u5929\uff5e ------======= \u043d\u0435\u0449\u043e \u043d\u0430 "
    "\u0411\u044a\u043b\u0433\u0430\u0440\u0441\u043a\u0438 ''''''```````\"\"\"\"......!!!!!!?????? I've been "
    "'told he's there, 'RE you sure? 'M not sure I'll make it, 'D you like some tea? We'Ve a'lL"
)

# sha256(str(tokenizer.encode(CHKTXT))) -> name: the rows of the converter's table (ggml-org/llama.cpp,
# convert_hf_to_gguf.py / conversion/base.py, get_vocab_base_pre) for models of the families written here.
CHKHSH = {
    "0ef9807a4087ebef797fc749390439009c3b9eda9ad1a097abbe738f486c01e5": "llama-bpe",  # Meta-Llama-3-8B
    "c136ed14d01c2745d4f60a9596ae66800e2b61fa45643e72436041855ad4089d": "smaug-bpe",  # Smaug-Llama-3-70B
    "855059429035d75a914d1eda9f10a876752e281a054a7a3d421ef0533e5b6249": "smollm",  # SmolLM-135M (llama)
    "63b97e4253352e6f357cc59ea5b583e3a680eaeaf2632188c2b952de2588485e": "tekken",  # Mistral-Nemo-Base-2407
    "e636dc30a262dcc0d8c323492e32ae2b70728f4df7dfe9737d9f920a282b8aea": "qwen2",  # Qwen1.5-7B
    "d4540891389ea895b53b399da6ac824becc30f2fba0e9ddbb98f92e55ca0e97c": "qwen2",  # Qwen3-Embedding-0.6B
    "b3f499bb4255f8ca19fccd664443283318f2fd2414d5e0b040fbdd0cc195d6c5": "deepseek-r1-qwen",  # R1-Distill-Qwen
    "3ce83efda5659b07b1ad37ca97ca5797ea4285d9b9ab0dc679e4a720c9da7454": "gpt-2",  # openai-community/gpt2
}

# Split regexes of tokenizer.json -> llama.cpp's name (src/llama-vocab.cpp quotes them as "original regex
# from tokenizer.json").
SPLIT_REGEX = {
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
    r"\s+(?!\S)|\s+": "llama-bpe",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
    r"\s+(?!\S)|\s+": "qwen2",
}
NORMALIZERS = {"gpt-2": (None,), "llama-bpe": (None,), "qwen2": (None, "NFC")}  # tokenizer.json's normalizer type


def pre_tokenizer_name(folder: Path) -> Optional[str]:
    """llama.cpp's name for the pre-tokenizer of `folder`'s tokenizer.json (see the module doc), or None."""
    return probe_hash_name(folder) or regex_name(folder)


def probe_hash_name(folder: Path) -> Optional[str]:
    """The converter's way: the tokenizer (transformers, as the converter loads it) encodes CHKTXT."""
    try:
        from transformers import AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)
        ids = tok.encode(CHKTXT)
    except Exception:  # noqa: BLE001 - not loadable by transformers: the tokenizer.json decides
        return None
    return CHKHSH.get(hashlib.sha256(str(ids).encode()).hexdigest())


def regex_name(folder: Path) -> Optional[str]:
    """The name of tokenizer.json's own pre-tokenizer where it is exactly one llama.cpp implements."""
    from wide_export.base.paths import read_json

    raw = read_json(Path(folder) / "tokenizer.json", hint="the tokenizer file looks damaged")
    if not isinstance(raw, dict):
        return None
    name = _structure_name(raw.get("pre_tokenizer"))
    normalizer = raw.get("normalizer")
    kind = normalizer.get("type") if isinstance(normalizer, dict) else normalizer
    return name if name is not None and kind in NORMALIZERS[name] else None


def _structure_name(pre: Any) -> Optional[str]:
    if not isinstance(pre, dict):
        return None
    if pre.get("type") == "ByteLevel":  # GPT-2's own regex inside ByteLevel, no space added in front
        return "gpt-2" if pre.get("use_regex", True) is True and pre.get("add_prefix_space") is False else None
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else None
    if not isinstance(steps, list) or len(steps) != 2 or not all(isinstance(s, dict) for s in steps):
        return None
    split, byte_level = steps
    pattern = split.get("pattern")
    if (split.get("type") != "Split" or split.get("behavior") != "Isolated" or split.get("invert") is not False
            or not isinstance(pattern, dict) or not isinstance(pattern.get("Regex"), str)):
        return None
    if (byte_level.get("type") != "ByteLevel" or byte_level.get("use_regex") is not False
            or byte_level.get("add_prefix_space") is not False):
        return None
    return SPLIT_REGEX.get(pattern["Regex"])
