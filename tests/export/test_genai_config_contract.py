"""genai_config.json against independent sources (mutation testing), without an export:
the graph's own input/output names (io_spec, what the ONNX file is written with), the model's
dimensions, the search section (greedy, no penalties), and the special ids with no folder (the demo) or with config.json
only. The end-to-end load by onnxruntime-genai is tests/export/test_genai.py (minutes)."""

from __future__ import annotations

import json

import pytest

transformers = pytest.importorskip("transformers")

from tests.helpers import make_checkpoint  # noqa: E402
from wide_export.checkpoint import load_wide_model  # noqa: E402
from wide_export.ops import io_spec  # noqa: E402
from wide_export.export.genai_config import (GENAI_CONFIG_NAME, genai_config, special_tokens,  # noqa: E402
                                             tokenizer_files, write_genai_files)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    folder = make_checkpoint(tmp_path_factory.mktemp("ckpt"), vocab_size=96, seed=4)
    hf = json.loads((folder / "config.json").read_text())
    hf.update(bos_token_id=5, eos_token_id=7, pad_token_id=None)
    (folder / "config.json").write_text(json.dumps(hf))
    return load_wide_model(folder)


def test_decoder_section_states_the_graph_and_the_model(loaded):
    cfg = genai_config(loaded, "model.onnx")
    model, c = cfg["model"], loaded.config
    dec = model["decoder"]
    n = c.num_layers
    ins = dec["inputs"]
    assert [ins["input_ids"], ins["attention_mask"], ins["position_ids"]] + [
        (ins["past_key_names"] if kv == "key" else ins["past_value_names"]) % i
        for i in range(n) for kv in ("key", "value")] == io_spec.input_names(n)
    outs = dec["outputs"]
    assert [outs["logits"]] + [(outs["present_key_names"] if kv == "key" else outs["present_value_names"]) % i
                               for i in range(n) for kv in ("key", "value")] == io_spec.output_names(n)
    assert dec["filename"] == "model.onnx"
    assert (dec["head_size"], dec["hidden_size"], dec["num_attention_heads"], dec["num_hidden_layers"],
            dec["num_key_value_heads"]) == (c.head_dim, c.hidden_size, c.num_attention_heads, n,
                                            c.num_key_value_heads)
    assert dec["session_options"] == {"log_id": "onnxruntime-genai", "provider_options": []}
    assert model["context_length"] == c.max_position_embeddings == cfg["search"]["max_length"]
    assert (model["vocab_size"], model["type"]) == (96, "llama")
    assert (model["bos_token_id"], model["eos_token_id"], model["pad_token_id"]) == (5, 7, 7)  # pad: the eos


def test_search_section_is_greedy_without_penalties(loaded):
    """The neutral values of transformers' GenerationConfig (4.x states them as its defaults; 5.x
    leaves them None and resolves them to these in `generate`): greedy search, no penalty, one
    sequence; onnxruntime-genai's own keys: beams stop early, past and present are separate buffers
    (the graph concatenates past + new)."""
    search = genai_config(loaded, "model.onnx")["search"]
    want = {"diversity_penalty": 0.0, "do_sample": False, "early_stopping": True, "length_penalty": 1.0,
            "max_length": loaded.config.max_position_embeddings, "min_length": 0, "no_repeat_ngram_size": 0,
            "num_beams": 1, "num_return_sequences": 1, "past_present_share_buffer": False,
            "repetition_penalty": 1.0, "temperature": 1.0, "top_k": 50, "top_p": 1.0}
    assert search == want
    assert {k: type(v) for k, v in search.items()} == {k: type(v) for k, v in want.items()}


def test_demo_ids_and_no_tokenizer_files(tmp_path):
    from wide_export.checkpoint.demo import demo_model  # noqa: F401 - the demo has no folder
    from wide_export.model.demo import DEMO_SPEC

    class Demo:
        model_dir, sources = None, {}

    hf = DEMO_SPEC.hf_config()
    ids = special_tokens(Demo())
    assert ids == {"bos_token_id": hf.bos_token_id, "eos_token_id": hf.eos_token_id, "pad_token_id": hf.eos_token_id}
    assert tokenizer_files(Demo()) == []


def test_missing_ids_fall_back_to_llama_defaults(tmp_path):
    folder = make_checkpoint(tmp_path / "ckpt", vocab_size=64, seed=1)
    hf = json.loads((folder / "config.json").read_text())
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        hf.pop(key, None)
    (folder / "config.json").write_text(json.dumps(hf))
    (folder / "generation_config.json").write_text("[1, 2]")  # not an object: ignored
    loaded = load_wide_model(folder)
    assert special_tokens(loaded) == {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}
    (folder / "tokenizer.json").write_text("{}")
    out = tmp_path / "out"
    out.mkdir()
    assert sorted(write_genai_files(loaded, out, "m.onnx")) == ["generation_config.json", "tokenizer.json"]
    assert (out / "tokenizer.json").read_text() == "{}"
    assert json.loads((out / GENAI_CONFIG_NAME).read_text())["model"]["decoder"]["filename"] == "m.onnx"
