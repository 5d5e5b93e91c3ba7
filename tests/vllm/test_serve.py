"""`wide-vllm serve OUT` (vLLM's own `serve`: the CPU wheel's `vllm` command cannot find its own version, see
wide_export/vllm/compat.py) answers the official openai client with the reference's text, streamed and not.

The text is known exactly: the prompts are token ids (the completions API takes them), their greedy tokens
come from the independent reference (transformers + hooked routers + LoRA merged by hand), and the folder's
byte-level tokenizer is written so that every id the reference generates is one printable ASCII byte; so the
expected text is the decode of those ids, without any partial UTF-8 character to detokenise differently."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.vllm.support import KV_CACHE_BYTES, PROMPTS, SHM, checkpoint, engine_env, export, reference_tokens

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]
NEW = 12
KEY = "wide-test-key"  # WIDE_API_KEY of the served fixture: wide-vllm guards every route but /health with it
EOS = 2  # the demo tokenizer's </s>: generation stops there, as in the reference below


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _expected(ckpt, prompts):
    """Reference tokens per prompt, cut after the first eos (the server stops there)."""
    out = []
    for tokens in reference_tokens(ckpt, prompts, NEW):
        out.append(tokens[:tokens.index(EOS) + 1] if EOS in tokens else tokens)
    return out


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from wide_export.model.demo_tokenizer import write_demo_tokenizer

    root = tmp_path_factory.mktemp("vllm-serve")
    ckpt = checkpoint(root / "ckpt", "llama")
    prompts = [PROMPTS[0], PROMPTS[2]]
    want = _expected(ckpt, prompts)
    ascii_bytes = iter(range(ord("a"), 127))
    used = sorted({t for tokens in want for t in tokens} - {0, 1, 2})
    write_demo_tokenizer(ckpt, {i: next(ascii_bytes) for i in used})  # other ids: special tokens, no text
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(ckpt))
    texts = [tok.decode(t, skip_special_tokens=True) for t in want]
    assert all(len(t) >= 3 for t in texts), texts
    out = export(ckpt, root / "out")
    port = _free_port()
    log = open(root / "serve.log", "w")
    before = set(SHM.glob("vllm*")) if SHM.is_dir() else set()
    proc = subprocess.Popen(
        [sys.executable, "-c", "from wide_export.vllm.compat import main; main()", "serve", str(out),
         "--port", str(port), "--served-model-name", "wide", "--dtype", "float32",  # wide-vllm's default host
         "--max-model-len", "256", "--kv-cache-memory-bytes", str(KV_CACHE_BYTES), "--enforce-eager"],
        stdout=log, stderr=subprocess.STDOUT, env={**engine_env(), "WIDE_API_KEY": KEY}, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, (root / "serve.log").read_text()[-4000:]
            assert time.monotonic() < deadline, (root / "serve.log").read_text()[-4000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(1)
        yield port, prompts, texts, want
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
        for seg in (set(SHM.glob("vllm*")) if SHM.is_dir() else set()) - before:
            seg.unlink(missing_ok=True)


def _client(port: int):
    import openai

    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, timeout=120)


def test_completion_text_equals_the_reference(served):
    port, prompts, texts, want = served
    client = _client(port)
    for prompt, text, tokens in zip(prompts, texts, want):
        r = client.completions.create(model="wide", prompt=prompt, max_tokens=NEW, temperature=0)
        assert r.choices[0].text == text
        assert r.choices[0].finish_reason == ("stop" if tokens[-1] == EOS else "length")
        assert r.usage.prompt_tokens == len(prompt) and r.usage.completion_tokens == len(tokens)


def test_streamed_completion_text_equals_the_reference(served):
    port, prompts, texts, _ = served
    client = _client(port)
    for prompt, text in zip(prompts, texts):
        chunks = list(client.completions.create(model="wide", prompt=prompt, max_tokens=NEW, temperature=0,
                                                stream=True))
        assert len(chunks) > 2  # streamed, not one answer
        assert "".join(c.choices[0].text for c in chunks if c.choices) == text


def test_batched_prompts_in_one_request(served):
    """Both prompts in one request: vLLM schedules them together; each answer equals its reference."""
    port, prompts, texts, _ = served
    r = _client(port).completions.create(model="wide", prompt=prompts, max_tokens=NEW, temperature=0)
    assert [c.text for c in sorted(r.choices, key=lambda c: c.index)] == texts


def test_listens_on_loopback_only_by_default(served):
    """No --host given: wide-vllm serve listens on 127.0.0.1 (vLLM's own default is every interface)."""
    from tests.helpers import listening_tcp

    port = served[0]
    addresses = [a for a in listening_tcp().values() if int(a.rsplit(":", 1)[1], 16) == port]
    assert addresses and all(a == f"0100007F:{port:04X}" for a in addresses), addresses


def test_the_api_key_guards_every_route_but_health(served):
    """WIDE_API_KEY set: vLLM's own guard covers /v1; wide-vllm's (vllm/auth.GuardAll) the rest, /invocations
    (generation too), /tokenize and /metrics included. /health stays open."""
    import json
    import urllib.error

    port, prompts, _, _ = served

    def status(path: str, key=None, body=None) -> int:
        headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
        req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers,
                                     data=None if body is None else json.dumps(body).encode())
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return resp.status
        except urllib.error.HTTPError as err:
            return err.code

    completion = {"model": "wide", "prompt": prompts[0], "max_tokens": 2}
    tokenize = {"model": "wide", "prompt": "abc"}
    for path, body in (("/v1/models", None), ("/v1/completions", completion), ("/invocations", completion),
                       ("/tokenize", tokenize), ("/metrics", None)):
        assert status(path, body=body) == 401, path
        assert status(path, "wrong", body) == 401, path
        assert status(path, KEY, body) == 200, path
    assert status("/health") == 200
