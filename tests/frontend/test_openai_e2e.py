"""The README's path end to end: `wide-export onnx --model CKPT`, `wide-export triton --streaming`,
`wide-export serve --openai-port` (the real command in a child process, a real tritonserver), driven
with the official `openai` client. Texts are compared with the PyTorch reference's greedy tokens
decoded by the checkpoint's own tokenizer (transformers); the checkpoint is built so that its greedy
chat answer splits a character across three tokens and ends at an eos id of its
generation_config.json (tests/text_checkpoint.py). A second model in the same repository has no chat
template. The metrics port is scraped before and after."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest

from tests.text_checkpoint import CHARACTER, MESSAGES, STEPS

PLAIN = "wide_llm_plain"  # the same model without a chat template
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@pytest.fixture(scope="module")
def served(text_repo, tmp_path_factory):
    """`wide-export serve --repository REPO --openai-port P --metrics-port M` in a child process."""
    from wide_export.tritonserver.server import free_port

    repo = tmp_path_factory.mktemp("openai") / "repo"
    shutil.copytree(text_repo, repo)
    shutil.copytree(repo / "wide_llm", repo / PLAIN)
    config = repo / PLAIN / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "wide_llm"', f'name: "{PLAIN}"'))
    version = repo / PLAIN / "1"
    (version / "chat_template.jinja").unlink(missing_ok=True)
    cfg = json.loads((version / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (version / "tokenizer_config.json").write_text(json.dumps(cfg))
    port, metrics = free_port(), free_port()
    log = open(repo.parent / "serve.log", "w")
    proc = subprocess.Popen([sys.executable, "-c", "from wide_export.cli import main; main()", "serve",
                             "--repository", str(repo), "--openai-port", str(port), "--metrics-port", str(metrics)],
                            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "NO_PROXY": "*"})
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        assert proc.poll() is None, (repo.parent / "serve.log").read_text()
        try:
            with _DIRECT.open(base + "/health", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            time.sleep(0.2)
    else:
        proc.kill()
        pytest.fail("serve never became ready:\n" + (repo.parent / "serve.log").read_text())
    yield base, f"http://127.0.0.1:{metrics}/metrics"
    proc.send_signal(2)  # Ctrl-C
    try:
        assert proc.wait(60) == 130, (repo.parent / "serve.log").read_text()[-3000:]  # 128 + SIGINT
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()


@pytest.fixture(scope="module")
def client(served):
    from openai import OpenAI

    return OpenAI(base_url=served[0] + "/v1", api_key="none", max_retries=0, timeout=120)


def _chat_expected(text_ckpt):
    return text_ckpt.expected(text_ckpt.chat_ids, STEPS)


def test_models_lists_both(client):
    assert sorted(m.id for m in client.models.list().data) == sorted(["wide_llm", PLAIN])


def test_streamed_chat_equals_the_reference_and_stops_at_eos(client, text_ckpt):
    tokens, text, reason = _chat_expected(text_ckpt)
    assert reason == "stop" and CHARACTER in text
    stream = client.chat.completions.create(model="wide_llm", messages=MESSAGES, temperature=0, max_tokens=STEPS,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    deltas = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert "".join(deltas) == text
    assert any(CHARACTER in d for d in deltas)  # its three tokens' bytes arrived as one whole character
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "stop" and set(finishes[:-1]) == {None}
    usage = chunks[-1].usage  # the one usage chunk comes last, without choices
    assert chunks[-1].choices == [] and sum(c.usage is not None for c in chunks) == 1
    assert (usage.prompt_tokens, usage.completion_tokens) == (len(text_ckpt.chat_ids), len(tokens))


def test_chat_and_completions_without_streaming(client, text_ckpt):
    tokens, text, _ = _chat_expected(text_ckpt)
    chat = client.chat.completions.create(model="wide_llm", messages=MESSAGES, temperature=0, max_tokens=STEPS)
    assert chat.choices[0].message.content == text and chat.choices[0].finish_reason == "stop"
    assert chat.usage.completion_tokens == len(tokens)
    prompt = "Once upon a time"
    ids = text_ckpt.tokenizer(prompt).input_ids  # BOS added, as the tokenizer says
    want_tokens, want_text, want_reason = text_ckpt.expected(ids, 10)
    done = client.completions.create(model="wide_llm", prompt=prompt, temperature=0, max_tokens=10)
    assert done.choices[0].text == want_text and done.choices[0].finish_reason == want_reason
    assert (done.usage.prompt_tokens, done.usage.completion_tokens) == (len(ids), len(want_tokens))
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="wide_llm", prompt=prompt, temperature=0, max_tokens=10, stream=True) if c.choices)
    assert streamed == want_text


def test_a_stop_string_ends_the_answer_before_it(client, text_ckpt):
    _, text, _ = _chat_expected(text_ckpt)
    stop = text[text.index(CHARACTER) + 1:][:2]
    for stream in (False, True):
        got = client.chat.completions.create(model="wide_llm", messages=MESSAGES, temperature=0, max_tokens=STEPS,
                                             stop=[stop], stream=stream)
        if stream:
            chunks = [c for c in got if c.choices]
            content, finish = "".join(c.choices[0].delta.content or "" for c in chunks), chunks[-1].choices[0].finish_reason
        else:
            content, finish = got.choices[0].message.content, got.choices[0].finish_reason
        assert (content, finish) == (text[:text.index(stop)], "stop")


def test_max_tokens_ends_with_length(client, text_ckpt):
    tokens = text_ckpt.reference(text_ckpt.chat_ids, 3)
    chat = client.chat.completions.create(model="wide_llm", messages=MESSAGES, temperature=0,
                                          max_completion_tokens=3)
    assert chat.choices[0].finish_reason == "length"
    assert chat.choices[0].message.content == text_ckpt.tokenizer.decode(tokens.tolist(), skip_special_tokens=True)


def test_16_concurrent_streaming_clients_are_exact(client, text_ckpt):
    from tests.triton.support import run_concurrently

    prompts = [f"Client {i} says" + " hello" * (i % 5) for i in range(16)]
    got: dict = {}

    def one(i):
        stream = client.completions.create(model="wide_llm", prompt=prompts[i], temperature=0, max_tokens=20,
                                           stream=True)
        chunks = [c for c in stream if c.choices]
        got[i] = ("".join(c.choices[0].text for c in chunks), chunks[-1].choices[0].finish_reason)

    run_concurrently([lambda i=i: one(i) for i in range(16)], timeout_s=300)
    for i, prompt in enumerate(prompts):
        _, text, reason = text_ckpt.expected(text_ckpt.tokenizer(prompt).input_ids, 20)
        assert got[i] == (text, reason), prompt


def test_malformed_requests_are_400_in_openai_shape_and_good_ones_stay_exact(client, served, text_ckpt):
    import openai

    cases = [
        (dict(model="wide_llm", messages=MESSAGES, max_tokens="many"), openai.BadRequestError, "max_tokens"),
        (dict(model="wide_llm", messages=MESSAGES, temperature="hot"), openai.BadRequestError, "temperature"),
        (dict(model="wide_llm", messages=MESSAGES, n=2), openai.BadRequestError, "n"),
        (dict(model="wide_llm", messages="hello"), openai.BadRequestError, "messages"),
        (dict(model="nope", messages=MESSAGES), openai.NotFoundError, "model"),
        (dict(model=PLAIN, messages=MESSAGES), openai.BadRequestError, None),  # no chat template
    ]
    _, text, _ = _chat_expected(text_ckpt)
    for kwargs, error, param in cases:
        with pytest.raises(error) as err:
            client.chat.completions.create(**kwargs)
        body = err.value.body
        assert isinstance(body, dict) and body.get("message"), body  # OpenAI's error object
        if param is not None:
            assert body.get("param") == param, body
        good = client.chat.completions.create(model="wide_llm", messages=MESSAGES, temperature=0, max_tokens=STEPS)
        assert good.choices[0].message.content == text
    # A too-long prompt is refused by the model itself (400), the plain model still completes.
    with pytest.raises(openai.BadRequestError, match="limit"):
        client.completions.create(model=PLAIN, prompt="x" * 600, max_tokens=4)
    plain = client.completions.create(model=PLAIN, prompt="Once upon a time", temperature=0, max_tokens=5)
    assert plain.choices[0].text == text_ckpt.expected(text_ckpt.tokenizer("Once upon a time").input_ids, 5)[1]
    # Not JSON at all.
    request = urllib.request.Request(served[0] + "/v1/chat/completions", data=b"{not json", method="POST",
                                     headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as err:
        _DIRECT.open(request, timeout=30)
    assert err.value.code == 400 and "error" in json.loads(err.value.read())


def test_metrics_count_the_openai_requests(client, served, text_ckpt):
    from prometheus_client.parser import text_string_to_metric_families

    def scrape():
        with _DIRECT.open(served[1], timeout=10) as r:
            families = text_string_to_metric_families(r.read().decode())
        return {(s.name, s.labels.get("model_name"), s.labels.get("finished_reason")): s.value
                for f in families for s in f.samples if "le" not in s.labels}

    before = scrape()
    tokens, _, _ = _chat_expected(text_ckpt)
    for _ in range(2):
        client.chat.completions.create(model="wide_llm", messages=MESSAGES, temperature=0, max_tokens=STEPS)
    time.sleep(0.5)
    after = scrape()
    key = ("wide:request_success_total", "wide_llm", "stop")
    assert after[key] - before.get(key, 0) == 2
    key = ("wide:generation_tokens_total", "wide_llm", None)
    assert after[key] - before.get(key, 0) == 2 * len(tokens)
    key = ("wide:time_to_first_token_seconds_count", "wide_llm", None)
    assert after[key] - before.get(key, 0) == 2
    assert np.isfinite(after[("wide:inter_token_latency_seconds_sum", "wide_llm", None)])
