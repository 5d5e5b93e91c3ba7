"""A byte-level tokenizer for the 256-token demo model, so its exports and repositories take text.

Built with Hugging Face `tokenizers` and saved with transformers (`tokenizer.json`,
`tokenizer_config.json`, the chat template), as a real checkpoint carries them:
ids 0, 1, 2 are the special tokens `<unk>`, `<s>` (BOS, added in front of a prompt)
and `</s>` (EOS), the demo config's ids; every other id is one byte, GPT-2's
byte-level alphabet (`ByteLevel` pre-tokenizer and decoder, no merges), so any
UTF-8 text but the bytes 0x00-0x02 encodes. A character of several UTF-8 bytes
is several tokens. The model has random weights: its text is noise, but it
flows through the same tokenizer, stop rules and streaming as a real model's.

`byte_of_id` lets tests place bytes on chosen ids (e.g. the ids a model
generates greedily), to build a checkpoint whose output text is known; an id
3..255 it leaves out becomes a special token `<|special_ID|>` (no text).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

SPECIALS = ("<unk>", "<s>", "</s>")
# A plain role-tagged template (the demo model was not trained on any).
CHAT_TEMPLATE = ("{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>\n"
                 "{{ message['content'] }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def default_byte_of_id() -> dict[int, int]:
    """id -> byte: id i is byte i for i >= len(SPECIALS)."""
    return {i: i for i in range(len(SPECIALS), 256)}


def demo_tokenizer(byte_of_id: Optional[dict[int, int]] = None, chat_template: Optional[str] = CHAT_TEMPLATE):
    """A transformers PreTrainedTokenizerFast over a 256-id byte-level vocabulary."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    byte_of_id = default_byte_of_id() if byte_of_id is None else byte_of_id
    if not set(byte_of_id) <= set(range(len(SPECIALS), 256)) or len(set(byte_of_id.values())) != len(byte_of_id):
        raise ValueError("byte_of_id must map ids 3..255 to distinct bytes")
    char = bytes_to_unicode()
    vocab = {name: i for i, name in enumerate(SPECIALS)}
    vocab.update({char[b]: i for i, b in byte_of_id.items()})
    extra = {f"<|special_{i}|>": i for i in range(len(SPECIALS), 256) if i not in byte_of_id}
    vocab.update(extra)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", 1)])
    tok.add_special_tokens(list(SPECIALS) + list(extra))
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   chat_template=chat_template)


def write_demo_tokenizer(folder: Path, byte_of_id: Optional[dict[int, int]] = None,
                         chat_template: Optional[str] = CHAT_TEMPLATE) -> list[str]:
    """Save the demo tokenizer's files into `folder`; returns their names."""
    before = set(p.name for p in Path(folder).iterdir())
    demo_tokenizer(byte_of_id, chat_template).save_pretrained(str(folder))
    return sorted(set(p.name for p in Path(folder).iterdir()) - before)
