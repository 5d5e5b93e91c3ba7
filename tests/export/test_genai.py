"""onnxruntime-genai loads a wide-export folder as written and generates the reference's greedy tokens.

The reference is the project's PyTorch model (wide_export.generation.torch_step);
the tokenizer check trains a tiny byte-level BPE offline with `tokenizers`
and compares onnxruntime-genai's Tokenizer with it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

og = pytest.importorskip("onnxruntime_genai")
torch = pytest.importorskip("torch")

from tests.helpers import make_checkpoint  # noqa: E402
from wide_export.checkpoint import load_wide_model  # noqa: E402
from wide_export.export.genai_config import GENAI_CONFIG_NAME  # noqa: E402
from wide_export.export.onnx_export import export_onnx  # noqa: E402
from wide_export.generation.torch_step import greedy_generate  # noqa: E402

NEW_TOKENS = 12


def _prompts(vocab: int, n: int = 3, length: int = 7, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (n, length), generator=g).tolist()


def _reference(model, prompt: list[int], eos) -> list[int]:
    """Reference greedy tokens, cut after the first eos (where onnxruntime-genai stops)."""
    new = greedy_generate(model, torch.tensor([prompt]), max_new_tokens=NEW_TOKENS)[0].tolist()
    stops = set(eos if isinstance(eos, list) else [eos])
    for i, t in enumerate(new):
        if t in stops:
            return new[: i + 1]
    return new


def _genai_greedy(model, prompt: list[int]) -> list[int]:
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + NEW_TOKENS, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(prompt)
    out = []
    while not gen.is_done():
        gen.generate_next_token()
        out.append(int(gen.get_next_tokens()[0]))
    return out


@pytest.fixture(scope="module", params=["float32", "float16", "float32-external-data"])
def demo_export(request, tmp_path_factory):
    dtype = request.param
    out = tmp_path_factory.mktemp(f"genai-{dtype}") / "onnx"
    if dtype == "float32":  # the real command, as users run it
        from wide_export.bench.serving import export_onnx_cli

        export_onnx_cli(out)
        loaded = load_wide_model(None)
    elif dtype == "float32-external-data":  # as every real model (> 1 GiB): weights in model.onnx.data
        import wide_export.export.onnx_export as onnx_export

        loaded = load_wide_model(None)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(onnx_export, "EXTERNAL_DATA_THRESHOLD", 0)
            export_onnx(loaded, out)
        assert (out / "model.onnx.data").is_file()
    else:
        loaded = load_wide_model(None, dtype=dtype)
        export_onnx(loaded, out)
    return dtype, out, loaded


def test_genai_greedy_matches_reference(demo_export):
    dtype, out, loaded = demo_export
    cfg = json.loads((out / GENAI_CONFIG_NAME).read_text())
    assert cfg["model"]["decoder"]["filename"] == "model.onnx"
    # the demo model's transformers config: Llama's default special tokens, 512 positions
    assert (cfg["model"]["bos_token_id"], cfg["model"]["eos_token_id"], cfg["model"]["pad_token_id"]) == (1, 2, 2)
    assert cfg["model"]["context_length"] == cfg["search"]["max_length"] == 512
    model = og.Model(str(out))
    torch.manual_seed(0)
    ref_model = loaded.model.eval()
    seen = set()
    for prompt in _prompts(loaded.config.vocab_size):
        ref = _reference(ref_model, prompt, cfg["model"]["eos_token_id"])
        got = _genai_greedy(model, prompt)
        assert got == ref, (dtype, prompt)
        seen.update(ref)
    assert len(seen) > NEW_TOKENS  # the prompts exercise varied tokens, not one repeated id


TEXT = ["the quick brown fox jumps over the lazy dog", "wide routers pick groups of width for every token",
        "prefill and decode share one graph with a key value cache"]
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>", "<|end|>"]


def _tiny_tokenizer(folder: Path, context: int):
    """A byte-level BPE (GPT-2 style) trained offline on TEXT, saved as a Hugging Face tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TEXT * 10, trainer)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "pad_token": "<pad>", "unk_token": "<unk>", "model_max_length": context}))
    (folder / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"}))
    return tok


def test_genai_tokenizer_and_special_tokens(tmp_path):
    context = 384
    folder = make_checkpoint(tmp_path / "ckpt", vocab_size=336, max_position_embeddings=context, seed=5)
    tok = _tiny_tokenizer(folder, context)
    ids = {s: tok.token_to_id(s) for s in SPECIALS}
    hf = json.loads((folder / "config.json").read_text())
    hf.update(bos_token_id=ids["<s>"], eos_token_id=ids["</s>"], pad_token_id=ids["<pad>"])
    (folder / "config.json").write_text(json.dumps(hf))
    # generation_config.json overrides config.json's eos, as in chat models
    (folder / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": ids["<s>"], "eos_token_id": [ids["</s>"], ids["<|end|>"]]}))

    loaded = load_wide_model(folder)
    out = tmp_path / "onnx"
    export_onnx(loaded, out)

    copied = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"]
    for name in copied:
        assert (out / name).read_bytes() == (folder / name).read_bytes(), name
    files = json.loads((out / "wide_config.json").read_text())["files"]
    assert files["genai_config"] == GENAI_CONFIG_NAME and sorted(files["tokenizer"]) == sorted(copied)
    cfg = json.loads((out / GENAI_CONFIG_NAME).read_text())["model"]
    assert cfg["bos_token_id"] == ids["<s>"]
    assert cfg["eos_token_id"] == [ids["</s>"], ids["<|end|>"]]
    assert cfg["pad_token_id"] == ids["<pad>"]
    assert cfg["context_length"] == context
    assert cfg["vocab_size"] == 336

    model = og.Model(str(out))
    tokenizer = og.Tokenizer(model)
    for text in ("the lazy fox picks groups", "a key value cache for every token"):
        expected = tok.encode(text).ids
        assert list(tokenizer.encode(text)) == expected
        assert tokenizer.decode(expected) == tok.decode(expected) == text

    prompt = list(tokenizer.encode("wide routers pick the lazy dog"))
    ref = _reference(loaded.model.eval(), prompt, cfg["eos_token_id"])
    assert _genai_greedy(model, prompt) == ref

    # the README's lines run as written against this folder
    exec(compile(_readme_snippet(out), "README.md", "exec"), {})


def _readme_snippet(out: Path) -> str:
    """README's onnxruntime-genai snippet, its "OUT" replaced by `out`."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    snippet = next(b for b in readme.split("```python\n")[1:] if "import onnxruntime_genai" in b).split("```")[0]
    assert len(snippet.strip().splitlines()) <= 6  # a few lines to copy
    return snippet.replace('"OUT"', repr(str(out)))


def test_the_readme_snippet_generates_what_the_project_generates(demo_export, capsys):
    """README's snippet on the demo export (whose tokenizer adds a BOS, as Llama's do): its prompt ids are the
    project's tokenizer's (tokenizer.json through `tokenizers`, what `wide-export generate` and the Python API
    encode with) and its new tokens the PyTorch reference's greedy ones. onnxruntime-genai's encode left the BOS
    out, and the text differed."""
    dtype, out, loaded = demo_export
    if dtype != "float32":
        pytest.skip("the snippet as a user runs it: one float32 export is enough")
    from wide_export.checkpoint.text import find_codec

    scope: dict = {}
    snippet = _readme_snippet(out)
    capsys.readouterr()
    exec(compile(snippet, "README.md", "exec"), scope)
    text = capsys.readouterr().out
    encode, _ = find_codec(out)
    prompt = encode("The capital of France is")
    assert prompt[0] == json.loads((out / GENAI_CONFIG_NAME).read_text())["model"]["bos_token_id"]
    max_length = int(re.search(r"max_length=(\d+)", snippet).group(1))
    new = greedy_generate(loaded.model.eval(), torch.tensor([prompt]), max_new_tokens=max_length - len(prompt))
    ref = new[0].tolist()
    eos = json.loads((out / GENAI_CONFIG_NAME).read_text())["model"]["eos_token_id"]
    stops = set(eos if isinstance(eos, list) else [eos])
    ref = next((ref[: i + 1] for i, t in enumerate(ref) if t in stops), ref)
    assert list(scope["generator"].get_sequence(0)) == prompt + ref
    assert text  # it printed the new tokens' text (random weights: noise, partly invalid UTF-8, so not compared)
