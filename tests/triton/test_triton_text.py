"""Text in and out of a real tritonserver on loopback (HTTP generate_stream), against the PyTorch
reference's greedy tokens decoded by the same tokenizer; stops at eos, stop strings and
max_new_tokens; the LLM metrics scraped from the metrics port change by the expected counts."""

from __future__ import annotations

import json
import urllib.request

import numpy as np
import pytest

from tests.text_checkpoint import CHARACTER, MESSAGES, STEPS
from tests.triton.sse_stream import Stream

MODEL = "wide_llm"


def _chat_prompt(text_ckpt) -> str:
    return text_ckpt.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)


def _text_stream(server, **body) -> Stream:
    return Stream(server.endpoints.http, body).run()


def _joined(stream: Stream) -> tuple[np.ndarray, str, list[str]]:
    ids = np.array([e["output_ids"] for e in stream.events], dtype=np.int64).reshape(-1)
    return ids, "".join(e["text_output"] for e in stream.events), [e["finish_reason"] for e in stream.events]


def test_the_repository_carries_the_tokenizer_and_the_eos_ids(text_repo, text_ckpt):
    version = text_repo / MODEL / "1"
    assert (version / "tokenizer.json").read_bytes() == (text_ckpt.folder / "tokenizer.json").read_bytes()
    assert (version / "chat_template.jinja").is_file() or "chat_template" in (
        version / "tokenizer_config.json").read_text()
    settings = json.loads((version / "generation.json").read_text())
    assert settings["eos_token_ids"] == text_ckpt.eos
    assert settings["pad_token_id"] == text_ckpt.eos[0]  # no pad in the checkpoint: the first eos, as generate does


def test_streamed_text_equals_the_reference_and_stops_at_eos(text_server, text_ckpt):
    stream = _text_stream(text_server, text_input=_chat_prompt(text_ckpt), add_special_tokens=False,
                          max_new_tokens=STEPS)
    assert stream.status == 200, stream.events
    ids, text, reasons = _joined(stream)
    tokens, expected, reason = text_ckpt.expected(text_ckpt.chat_ids, STEPS)
    assert reason == "stop" and len(tokens) < STEPS  # the checkpoint was built so
    np.testing.assert_array_equal(ids, tokens)  # the eos id is the last token sent
    assert text == expected and CHARACTER in text
    pieces = [e["text_output"] for e in stream.events]
    assert not any(CHARACTER[0] in p and p != CHARACTER and CHARACTER not in p for p in pieces)
    assert reasons == [""] * (len(ids) - 1) + ["stop"]
    last = stream.events[-1]
    assert (last["num_input_tokens"], last["num_output_tokens"]) == (len(text_ckpt.chat_ids), len(ids))


def test_max_new_tokens_is_a_maximum_ending_in_length(text_server, text_ckpt):
    stream = _text_stream(text_server, text_input=_chat_prompt(text_ckpt), add_special_tokens=False,
                          max_new_tokens=3)
    ids, text, reasons = _joined(stream)
    tokens = text_ckpt.reference(text_ckpt.chat_ids, 3)
    np.testing.assert_array_equal(ids, tokens)
    assert text == text_ckpt.tokenizer.decode(tokens.tolist(), skip_special_tokens=True)
    assert reasons[-1] == "length"


def test_a_stop_string_cuts_the_text_and_ends_with_stop(text_server, text_ckpt):
    _, expected, _ = text_ckpt.expected(text_ckpt.chat_ids, STEPS)
    stop = expected[expected.index(CHARACTER) + 1:][:2]  # two characters after the split one
    stream = _text_stream(text_server, text_input=_chat_prompt(text_ckpt), add_special_tokens=False,
                          max_new_tokens=STEPS, stop_words=["never-there", stop])
    _, text, reasons = _joined(stream)
    assert text == expected[:expected.index(stop)] and reasons[-1] == "stop"


def test_stop_token_ids_and_ignore_eos(text_server, text_ckpt):
    tokens, _, _ = text_ckpt.expected(text_ckpt.chat_ids, STEPS)
    body = dict(input_ids=text_ckpt.chat_ids.tolist(), max_new_tokens=STEPS)
    ids, _, reasons = _joined(_text_stream(text_server, stop_token_ids=[int(tokens[2])], **body))
    np.testing.assert_array_equal(ids, tokens[:3])
    assert reasons[-1] == "stop"
    ids, _, reasons = _joined(_text_stream(text_server, ignore_eos=True, **body))
    np.testing.assert_array_equal(ids, text_ckpt.reference(text_ckpt.chat_ids, STEPS))  # on past the eos id
    assert reasons[-1] == "length"


def test_text_requests_without_a_tokenizer_or_with_bad_text_are_refused(text_server):
    stream = _text_stream(text_server, text_input="hi", max_new_tokens=2, seed=-1)
    assert stream.status == 400 and "seed" in stream.events[0]["error"]


def _scrape(server) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(server.endpoints.metrics, timeout=10) as r:
        text = r.read().decode()
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k not in ("model_name", "le")))
            if "le" in sample.labels:
                continue
            values[(sample.name, labels)] = sample.value
    return values


def test_metrics_change_by_the_expected_counts(text_server, text_ckpt):
    from tests.triton.support import wait_until

    before = _scrape(text_server)
    tokens, _, _ = text_ckpt.expected(text_ckpt.chat_ids, STEPS)
    runs = [dict(max_new_tokens=STEPS), dict(max_new_tokens=2), dict(max_new_tokens=STEPS)]
    for extra in runs:
        _text_stream(text_server, input_ids=text_ckpt.chat_ids.tolist(), **extra)
    generated = 2 * len(tokens) + 2
    after = {}

    def delta(name, **labels):
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    def settled() -> bool:  # a request's metrics are recorded as it ends: wait for the third (bounded)
        after.clear()
        after.update(_scrape(text_server))
        return delta("wide:e2e_request_latency_seconds_count") >= 3 and after[("wide:num_requests_running", ())] == 0

    wait_until(settled, 30.0)  # generous for a loaded machine; when it is on time the first scrape ends it

    assert delta("wide:request_success_total", finished_reason="stop") == 2
    assert delta("wide:request_success_total", finished_reason="length") == 1
    assert delta("wide:generation_tokens_total") == generated
    assert delta("wide:prompt_tokens_total") == 3 * len(text_ckpt.chat_ids)
    assert delta("wide:time_to_first_token_seconds_count") == 3
    assert delta("wide:inter_token_latency_seconds_count") == generated - 3
    assert delta("wide:request_queue_time_seconds_count") == 3
    assert delta("wide:e2e_request_latency_seconds_count") == 3
    assert delta("wide:request_generation_tokens_sum") == generated
    assert after[("wide:num_requests_running", ())] == 0 and after[("wide:num_requests_waiting", ())] == 0
    assert delta("wide:time_to_first_token_seconds_sum") > 0


@pytest.mark.parametrize("clients", [16])
def test_concurrent_text_streams_are_exact(text_server, text_ckpt, clients):
    from tests.triton.support import run_concurrently

    rng = np.random.default_rng(7)
    prompts = [f"Story {i}: " + "".join(rng.choice(list("abcdefgh "), size=int(rng.integers(3, 20))))
               for i in range(clients)]
    results: dict = {}

    def one(i):
        results[i] = _joined(_text_stream(text_server, text_input=prompts[i], max_new_tokens=24))

    run_concurrently([lambda i=i: one(i) for i in range(clients)], timeout_s=300)
    for i, prompt in enumerate(prompts):
        ids = text_ckpt.tokenizer(prompt).input_ids
        tokens, text, reason = text_ckpt.expected(ids, 24)
        np.testing.assert_array_equal(results[i][0], tokens, err_msg=prompt)
        assert results[i][1] == text and results[i][2][-1] == reason
