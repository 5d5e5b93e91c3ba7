"""A WIDE checkpoint with a tokenizer whose greedy chat answer is known to hold what the serving
tests need: a multi-byte character split across three tokens, then an eos id named in
generation_config.json that greedy decoding produces.

How: write a random-weight checkpoint (vocab 256), load it through the real loader (the PyTorch
reference), render a chat prompt with the demo byte-level tokenizer and decode greedily. Then move
bytes between ids the prompt does not use, so that three consecutive generated ids become the
UTF-8 bytes of "日" (E6 97 A5), and make a later generated id a special token named as eos. The
prompt's ids are unchanged, so the reference's greedy tokens stay what they were.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MESSAGES = [{"role": "user", "content": "Tell me a story."}]
CHARACTER = "日"  # E6 97 A5: three byte-level tokens
STEPS = 48


@dataclass
class TextCheckpoint:
    folder: Path
    tokenizer: object  # transformers tokenizer saved in the folder
    reference: object  # fn(prompt ids, n) -> greedy ids (PyTorch, the loaded checkpoint), no eos stop
    eos: list  # generation_config.json eos ids
    chat_ids: np.ndarray  # the rendered chat prompt's ids
    chat_tokens: np.ndarray  # the reference's greedy answer, up to and including the eos id

    def expected(self, prompt_ids, n: int) -> tuple[np.ndarray, str, str]:
        """(tokens, text, finish_reason) the server must give for `prompt_ids` and at most n tokens."""
        tokens = self.reference(prompt_ids, n)
        hits = [i for i, t in enumerate(tokens) if int(t) in self.eos]
        if hits:
            tokens = tokens[:hits[0] + 1]
        reason = "stop" if hits else "length"
        return tokens, self.tokenizer.decode(tokens.tolist(), skip_special_tokens=True), reason


def _find(gen: list[int], used: set[int]) -> tuple[int, int]:
    """(i, k): gen[i:i+3] distinct ids free to take the character's bytes, gen[k] a later id free to
    become eos (its first occurrence, no demo eos 2 before it)."""
    targets = set(CHARACTER.encode())
    for i in range(4, len(gen) - 3):  # some text before the character
        trio = gen[i:i + 3]
        if len(set(trio)) < 3 or set(trio) & (used | targets) or 2 in gen[:i + 3]:
            continue
        for k in range(i + 8, len(gen)):  # and some after it
            e = gen[k]
            if 2 in gen[:k + 1]:
                break
            if e not in used | targets | set(trio) and e not in gen[:k]:
                return i, k
    raise LookupError


def write_text_checkpoint(folder: Path) -> TextCheckpoint:
    import torch

    from wide_export.checkpoint.loader import load_wide_model
    from wide_export.model.demo_tokenizer import default_byte_of_id, demo_tokenizer, write_demo_tokenizer
    from wide_export.generation.torch_step import greedy_generate
    from wide_export.model.synthetic import SyntheticSpec, write_checkpoint

    base = demo_tokenizer()
    prompt = np.array(base.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True,
                                               return_dict=False), dtype=np.int64).reshape(-1)
    for seed in range(40):
        write_checkpoint(folder, SyntheticSpec(arch="llama", num_layers=2, seed=seed))
        model = load_wide_model(folder).model.eval()

        def reference(ids, n, model=model):
            x = torch.as_tensor(np.asarray(ids, dtype=np.int64)).reshape(1, -1)
            with torch.no_grad():
                return greedy_generate(model, x, torch.ones_like(x), n)[0].numpy()

        gen = reference(prompt, STEPS).tolist()
        try:
            i, k = _find(gen, set(prompt.tolist()) | {0, 1, 2})
        except LookupError:
            continue
        byte_of_id = default_byte_of_id()
        for tid, byte in zip(gen[i:i + 3], CHARACTER.encode()):
            byte_of_id[byte], byte_of_id[tid] = byte_of_id[tid], byte  # swap: the prompt's ids keep their bytes
        del byte_of_id[gen[k]]  # a special token without text
        for stale in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            (folder / stale).unlink(missing_ok=True)
        write_demo_tokenizer(folder, byte_of_id)
        eos = [2, gen[k]]
        (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": eos}))
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(folder))
        ids = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False)
        assert list(np.asarray(ids).reshape(-1)) == prompt.tolist()
        ckpt = TextCheckpoint(folder, tok, reference, eos, prompt, np.array(gen[:k + 1]))
        assert CHARACTER in ckpt.expected(prompt, STEPS)[1]
        return ckpt
    raise RuntimeError("no seed gave a usable greedy answer")
