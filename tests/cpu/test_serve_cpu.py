"""`wide-export serve --model DIR`: the OpenAI API on the CPU generation path (serving/cpu_engine.py, serving/cpu_server.py).
Tokens are checked against transformers with the routers hooked on by hand (tests/model/hf_routing.py), not
against our own generator; the engine's stops, budget and cancellation; the command's errors, its real HTTP
server (plain and streamed completions) and its exit on SIGTERM."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.cpu.test_generation import SPECS, _hf_greedy
from tests.helpers import assert_one_line_error, make_checkpoint

pytest.importorskip("fastapi")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("serve") / "ck", num_layers=2, **SPECS["llama"])


@pytest.fixture(scope="module")
def engine(ckpt):
    from wide_export.serving.cpu_engine import CpuEngine
    from wide_export.generation.cpu_generator import CpuGenerator

    engine = CpuEngine(CpuGenerator.load(ckpt), "wide")
    yield engine
    asyncio.run(engine.close())  # its worker thread does not outlive the module


def _collect(engine, **fields):
    from wide_export.serving.openai.engine import GenerationRequest

    async def go():
        return [c async for c in engine.generate(GenerationRequest(model="wide", **fields))]

    return asyncio.run(go())


PROMPT = [5, 9, 13, 2, 7]


def test_engine_streams_the_reference_greedy_tokens_one_chunk_each(engine, ckpt):
    chunks = _collect(engine, prompt_ids=PROMPT, max_tokens=6)
    assert [t for c in chunks for t in c.token_ids] == _hf_greedy(ckpt, [PROMPT], 6)[0]
    assert [len(c.token_ids) for c in chunks] == [1] * 6
    assert [c.finish_reason for c in chunks] == [None] * 5 + ["length"]
    assert chunks[-1].prompt_tokens == len(PROMPT) and chunks[-1].completion_tokens == 6


def test_a_stop_token_ends_the_generation_after_it(engine, ckpt):
    want = _hf_greedy(ckpt, [PROMPT], 6)[0]
    stop = want[2]
    chunks = _collect(engine, prompt_ids=PROMPT, max_tokens=6, stop_token_ids=[stop])
    got = [t for c in chunks for t in c.token_ids]
    assert got == want[:want.index(stop) + 1]
    assert chunks[-1].finish_reason == "stop"


def test_a_consumer_that_goes_away_stops_the_worker(engine, monkeypatch):
    from wide_export.serving.openai.engine import GenerationRequest

    made = []  # how many tokens the worker generated
    stream = engine.generator.stream
    monkeypatch.setattr(engine.generator, "stream", lambda *a, **k: made.append(len(stream(*a, **k))))

    async def go():
        gen = engine.generate(GenerationRequest(model="wide", prompt_ids=PROMPT, max_tokens=200))
        first = await gen.__anext__()
        await gen.aclose()  # waits for the worker, which stops at its next token
        return first

    start = time.perf_counter()
    assert len(asyncio.run(go()).token_ids) == 1
    assert time.perf_counter() - start < 30 and made[0] < 50, made
    assert len(_collect(engine, prompt_ids=PROMPT, max_tokens=2)) == 2  # the engine serves the next request


def test_sampling_follows_the_seed(engine):
    tokens = [[t for c in _collect(engine, prompt_ids=PROMPT, max_tokens=8, temperature=1.5, seed=s)
               for t in c.token_ids] for s in (7, 7, 8)]
    assert tokens[0] == tokens[1] and tokens[0] != tokens[2]


@pytest.mark.parametrize("fields", [dict(temperature=1e-45), dict(temperature=1.0, top_p=1e-300),
                                    dict(temperature=1e-30, top_p=1e-300)])
def test_a_tiny_temperature_is_greedy_and_a_tiny_top_p_keeps_the_most_likely_token(engine, ckpt, fields):
    """Below 1e-5 the temperature is greedy and top_p keeps at least the most likely token (as vLLM): the
    tokens of transformers' greedy decoding, where the sampler raised before (inf / no token left)."""
    chunks = _collect(engine, prompt_ids=PROMPT, max_tokens=4, seed=3, **fields)
    assert [t for c in chunks for t in c.token_ids] == _hf_greedy(ckpt, [PROMPT], 4)[0]


@pytest.fixture(scope="module")
def text_engine(text_ckpt):
    from wide_export.serving.cpu_engine import CpuEngine
    from wide_export.generation.cpu_generator import CpuGenerator

    engine = CpuEngine(CpuGenerator.load(text_ckpt.folder), "wide")
    yield engine
    asyncio.run(engine.close())


def test_engine_text_is_the_tokenizers_decode_of_its_tokens(text_engine, text_ckpt, monkeypatch):
    """A chat answer holding a character split across three tokens and ending at an eos id of
    generation_config.json: the chunks' text joined is transformers' decode of the reference's tokens, the
    character whole in one chunk (tests/text_checkpoint.py); each decode call sees a few tokens, never the
    whole answer (incremental: no decode of everything so far per token)."""
    from tests.text_checkpoint import CHARACTER, STEPS

    tokens, text, reason = text_ckpt.expected(text_ckpt.chat_ids, STEPS)
    chunks = _collect(text_engine, prompt_ids=text_ckpt.chat_ids.tolist(), max_tokens=STEPS)
    assert [t for c in chunks for t in c.token_ids] == tokens.tolist() and reason == "stop"
    assert "".join(c.text for c in chunks) == text and chunks[-1].finish_reason == "stop"
    assert any(CHARACTER in c.text for c in chunks)  # its three tokens' bytes released together
    real, seen = text_engine.generator.decode, []
    monkeypatch.setattr(text_engine.generator, "decode", lambda ids: seen.append(len(ids)) or real(ids))
    chunks = _collect(text_engine, prompt_ids=text_ckpt.chat_ids.tolist(), max_tokens=STEPS, ignore_eos=True)
    longer = text_ckpt.reference(text_ckpt.chat_ids, STEPS).tolist()
    assert [t for c in chunks for t in c.token_ids] == longer
    assert "".join(c.text for c in chunks) == text_ckpt.tokenizer.decode(longer, skip_special_tokens=True)
    assert 0 < max(seen) <= 16 < STEPS  # a window of a few tokens, not all 48


def test_a_stop_string_and_what_follows_are_never_sent(text_engine, text_ckpt):
    """The stop string (two characters after the split character): the text joined ends right before it, no
    chunk ever held its first character ahead of time, finish_reason stop, fewer tokens than the answer."""
    from tests.text_checkpoint import CHARACTER, STEPS

    tokens, text, _ = text_ckpt.expected(text_ckpt.chat_ids, STEPS)
    at = text.index(CHARACTER) + 2
    stop = text[at:at + 2]
    chunks = _collect(text_engine, prompt_ids=text_ckpt.chat_ids.tolist(), max_tokens=STEPS, stop=[stop])
    joined = "".join(c.text for c in chunks)
    assert joined == text[:text.index(stop)] and chunks[-1].finish_reason == "stop"
    assert len([t for c in chunks for t in c.token_ids]) < len(tokens)


def test_chat_prompts_hold_the_templates_one_bos_and_completions_get_theirs(text_engine, text_ckpt, monkeypatch):
    """/v1/chat/completions through the app on a CpuEngine: the template already writes BOS, so the prompt
    is its text encoded without special tokens (as Triton and vLLM: one BOS, not two), computed here with the
    tokenizers library on the folder's tokenizer.json; usage counts those tokens. /v1/completions text still
    gets the BOS the tokenizer adds."""
    from fastapi.testclient import TestClient
    from tokenizers import Tokenizer

    from tests.text_checkpoint import MESSAGES
    from wide_export.serving.cpu_engine import CpuEngine
    from wide_export.serving.openai.app import create_app
    from wide_export.serving.openai.models import ServedModel

    tok = Tokenizer.from_file(str(text_ckpt.folder / "tokenizer.json"))
    bos = text_ckpt.tokenizer.bos_token_id
    rendered = text_ckpt.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    want_chat = tok.encode(rendered, add_special_tokens=False).ids
    want_text = tok.encode("Once upon", add_special_tokens=True).ids
    assert want_chat[0] == bos != want_chat[1] and want_chat == text_ckpt.chat_ids.tolist()
    assert want_text[0] == bos != want_text[1]
    generator, seen = text_engine.generator, []
    stream = generator.stream
    monkeypatch.setattr(generator, "stream", lambda prompt, *a, **k: seen.append(list(prompt)) or stream(prompt, *a,
                                                                                                        **k))
    served = ServedModel(name="wide", triton_name="wide", folder=text_ckpt.folder,
                         max_model_len=int(generator.model.config.max_position_embeddings))
    served.load_text()
    with TestClient(create_app(CpuEngine(generator, "wide"), [served])) as client:
        chat = client.post("/v1/chat/completions", json={"model": "wide", "messages": MESSAGES, "max_tokens": 1})
        plain = client.post("/v1/completions", json={"model": "wide", "prompt": "Once upon", "max_tokens": 1})
    assert chat.status_code == plain.status_code == 200, (chat.text, plain.text)
    assert seen == [want_chat, want_text]
    assert chat.json()["usage"]["prompt_tokens"] == len(want_chat)
    assert plain.json()["usage"]["prompt_tokens"] == len(want_text)


@pytest.mark.parametrize("fields,fragment", [
    (dict(prompt_ids=PROMPT, max_tokens=10**6), "max_tokens"),
    (dict(prompt_ids=[10**6]), "outside the vocabulary"),
    (dict(prompt="hello"), "no tokenizer"),
])
def test_engine_refuses_bad_requests_as_invalid(engine, fields, fragment):
    from wide_export.serving.openai.engine import EngineError

    with pytest.raises(EngineError) as err:
        _collect(engine, **fields)
    assert err.value.kind == "invalid" and fragment in err.value.message


def _cli(*args, **kw):
    return subprocess.run([sys.executable, "-m", "wide_export", "serve", *args], capture_output=True, text=True,
                          timeout=120, **kw)


@pytest.mark.parametrize("args,fragment", [
    (("--openai-port", "0"), "give exactly one"),
    (("--repository", "r", "--model", "MODEL"), "give exactly one"),
    (("--model", "MODEL"), "--openai-port"),
    (("--model", "MODEL", "--openai-port", "0", "--grpc-port", "8001"), "--grpc-port"),
    (("--model", "nowhere", "--openai-port", "0"), "model folder not found"),
    (("--model", "/", "--openai-port", "0"), "config.json"),
    (("--model", "MODEL", "--openai-port", "0", "--log-verbose", "1"), "--log-verbose"),
    (("--repository", "r", "--dtype", "float16"), "--dtype is for --model"),
])
def test_serve_model_refuses_bad_input_in_one_line(ckpt, args, fragment):
    line = assert_one_line_error(_cli(*[str(ckpt) if a == "MODEL" else a for a in args]))
    assert fragment in line


def _post(url: str, body: dict) -> bytes:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return resp.read()


def test_serve_model_answers_completions_plain_and_streamed_then_stops_on_sigterm(ckpt):
    proc = subprocess.Popen([sys.executable, "-m", "wide_export", "serve", "--model", str(ckpt), "--openai-port",
                             "0", "--served-model-name", "wide"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "COLUMNS": "300"})
    try:
        url = None
        deadline = time.monotonic() + 120
        while url is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line or proc.poll() is None, proc.stderr.read()
            if "OpenAI http" in line:
                url = line.split("OpenAI ", 1)[1].split()[0]
        assert url, "the server did not print its ready line"
        want = _hf_greedy(ckpt, [PROMPT], 5)[0]
        body = {"model": "wide", "prompt": PROMPT, "max_tokens": 5, "temperature": 0, "return_token_ids": True}
        plain = json.loads(_post(f"{url}/completions", body))
        assert plain["choices"][0]["token_ids"] == want
        assert plain["usage"] == {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10}
        events = [line[len(b"data: "):] for line in _post(f"{url}/completions", {**body, "stream": True}).split(b"\n")
                  if line.startswith(b"data: ")]
        assert events[-1] == b"[DONE]"
        streamed = [t for e in events[:-1] for t in json.loads(e)["choices"][0].get("token_ids", [])]
        assert streamed == want
        tiny = json.loads(_post(f"{url}/completions", {**body, "temperature": 1e-45, "top_p": 1e-300}))
        assert tiny["choices"][0]["token_ids"] == want  # greedy, not an HTTP 500
        models = json.loads(urllib.request.urlopen(f"{url}/models", timeout=30).read())
        assert [m["id"] for m in models["data"]] == ["wide"]
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(60)
    assert rc == 143
