"""genai_config.json's special token ids against transformers' own `generate`.

A model with several eos ids and no pad id: transformers' `generate` pads the rows that stopped early
with one id of its own choosing. The expectation is taken from `generate` itself, run on an
independent tiny Llama (not from our code or a constant): a row is made to stop at its second token,
and the id `generate` fills the rest of that row with is what genai_config.json must say. Shown failing
with `eos[0]` changed to `eos[-1]` in genai_config.special_tokens.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tests.helpers import make_checkpoint  # noqa: E402
from wide_export.checkpoint import load_wide_model  # noqa: E402
from wide_export.export.genai_config import GENAI_CONFIG_NAME, write_genai_files  # noqa: E402

VOCAB, NEW = 64, 6


def _tiny_llama(seed: int):
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                                      bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(config).eval()


def _generate(model, prompts, eos):
    config = transformers.GenerationConfig(max_new_tokens=NEW, do_sample=False, eos_token_id=eos, pad_token_id=None,
                                           bos_token_id=None)
    with torch.no_grad():
        out = model.generate(prompts, attention_mask=torch.ones_like(prompts), generation_config=config)
    return out[:, prompts.shape[1]:].tolist()


@pytest.fixture(scope="module")
def transformers_padding():
    """(eos ids [e0, e1], the id transformers' generate pads a stopped row with) for a batch in which
    row 0 stops at its 2nd new token (e1) and row 1 never stops; e0 appears nowhere, so it can only be
    in the output as padding."""
    for seed in range(20):
        model = _tiny_llama(seed)
        prompts = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(seed))
        free = _generate(model, prompts, None)
        e1 = free[0][1]
        if e1 == free[0][0] or e1 in free[1]:
            continue
        e0 = next(t for t in range(VOCAB) if t not in free[0] + free[1] + prompts.flatten().tolist())
        got = _generate(model, prompts, [e0, e1])
        assert got[0][:2] == free[0][:2] and got[1] == free[1]
        pads = set(got[0][2:])
        assert len(pads) == 1, got  # one id fills the stopped row
        return [e0, e1], pads.pop()
    pytest.fail("no seed gave a row stopping at its 2nd token")


@pytest.mark.parametrize("where", ["config.json", "generation_config.json"])
def test_several_eos_ids_and_no_pad_id_give_the_pad_id_of_transformers_generate(tmp_path, transformers_padding,
                                                                                  where):
    eos, pad = transformers_padding
    folder = make_checkpoint(tmp_path / "ckpt", vocab_size=VOCAB, seed=3)
    hf = json.loads((folder / "config.json").read_text())
    for key in ("pad_token_id", "eos_token_id"):
        hf.pop(key, None)
    if where == "config.json":
        hf["eos_token_id"] = eos
    else:  # as chat models do: generation_config.json states the eos list, config.json one other id
        hf["eos_token_id"] = VOCAB - 1
        (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    (folder / "config.json").write_text(json.dumps(hf))
    out = tmp_path / "out"
    out.mkdir()
    write_genai_files(load_wide_model(folder), out, "model.onnx")
    model = json.loads((out / GENAI_CONFIG_NAME).read_text())["model"]
    assert model["eos_token_id"] == eos
    assert model["pad_token_id"] == pad


def test_transformers_pads_with_its_first_eos_id(transformers_padding):
    """What the fixture measured, stated: generate's pad falls back to the first eos id."""
    eos, pad = transformers_padding
    assert pad == eos[0]
