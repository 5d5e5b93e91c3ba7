"""serving/openai/protocol.py by itself: the bounds of each field (at and past them), the refusals' param and
words, and what the accessors return for each prompt and message form -- written out per case."""

from __future__ import annotations

import pydantic
import pytest

from wide_export.serving.openai.protocol import INT64, MAX_STOP, ChatCompletionRequest, CompletionRequest


def completion(**kw):
    return CompletionRequest(**{"prompt": "x", **kw})


def chat(**kw):
    return ChatCompletionRequest(**{"messages": [{"role": "user", "content": "hi"}], **kw})


def refusal(make, **kw) -> tuple[str, str]:
    """(param, message) of the first validation error."""
    with pytest.raises(pydantic.ValidationError) as err:
        make(**kw)
    first = err.value.errors()[0]
    ctx = first.get("ctx") or {}
    return ctx.get("param") or ".".join(str(p) for p in first["loc"]), str(first["msg"])


# -- bounds
@pytest.mark.parametrize("field, ok, bad", [
    ("temperature", [0.0, 2.0, 1.5], [-0.01, 2.01]),
    ("top_p", [1.0, 0.01], [0.0, 1.01]),
    ("seed", [-INT64, INT64 - 1, 0], [INT64, -INT64 - 1]),
    ("presence_penalty", [0.0], []),
    ("frequency_penalty", [0.0], []),
    ("max_tokens", [1, 4096], [0, -1]),
])
def test_numeric_bounds(field, ok, bad):
    for value in ok:
        assert getattr(completion(**{field: value}), field) == value
    for value in bad:
        param, _ = refusal(completion, **{field: value})
        assert param == field


def test_types_are_strict():
    assert refusal(completion, max_tokens=2.0)[0] == "max_tokens"  # 2.0 is not an integer
    assert refusal(completion, temperature="1")[0] == "temperature"
    assert refusal(completion, stream="yes")[0] == "stream"


def test_defaults():
    c = completion()
    assert (c.max_tokens, c.n, c.stream, c.echo, c.ignore_eos, c.return_token_ids) == (16, 1, False, False, False,
                                                                                      False)
    assert c.temperature is None and c.top_p is None and c.stop is None and c.model is None
    h = chat()
    assert h.max_tokens is None and h.max_completion_tokens is None and h.logprobs is False


# -- refusals of what this server cannot do
@pytest.mark.parametrize("kw, param, words", [
    ({"n": 2}, "n", "n=2 is not supported: this server returns one choice per request (n=1)"),
    ({"n": 0}, "n", "n=0 is not supported"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop", f"at most {MAX_STOP} stop sequences, got 5"),
    ({"stop": ["a", ""]}, "stop", "stop sequences must not be empty"),
    ({"stop": ""}, "stop", "stop sequences must not be empty"),
    ({"stream_options": {"include_usage": True}}, "stream_options",
     "stream_options is only allowed when stream is true"),
    ({"presence_penalty": 0.5}, "presence_penalty", "presence_penalty is not supported by this server (only 0)"),
    ({"frequency_penalty": -1.0}, "frequency_penalty", "frequency_penalty is not supported by this server (only 0)"),
    ({"logit_bias": {"1": 2.0}}, "logit_bias", "logit_bias is not supported by this server"),
    ({"stop_token_ids": [5, -1]}, "stop_token_ids[1]", "token id -1 is out of range"),
    ({"stop_token_ids": [INT64]}, "stop_token_ids[0]", f"token id {INT64} is out of range"),
    ({"best_of": 2}, "best_of", "best_of is not supported by this server (only 1)"),
    ({"echo": True}, "echo", "echo is not supported by this server"),
    ({"logprobs": 0}, "logprobs", "logprobs are not supported by this server"),
    ({"suffix": "end"}, "suffix", "suffix is not supported by this server"),
])
def test_completion_refusals(kw, param, words):
    got_param, message = refusal(completion, **kw)
    assert got_param == param and words in message


def test_what_is_allowed_at_the_edges():
    assert completion(n=1).n == 1 and completion(n=None).n is None
    assert completion(stop=["a", "b", "c", "d"]).stop_list() == ["a", "b", "c", "d"]
    assert completion(stop="end").stop_list() == ["end"] and completion().stop_list() == []
    assert completion(stream=True, stream_options={"include_usage": False}).include_usage() is False
    assert completion(stream=True, stream_options={"include_usage": True}).include_usage() is True
    assert completion(stream=True).include_usage() is False
    assert completion(stop_token_ids=[0, INT64 - 1]).stop_token_ids == [0, INT64 - 1]
    assert completion(best_of=1).best_of == 1 and completion(suffix="").suffix == ""
    assert completion(logit_bias={}).logit_bias == {}


@pytest.mark.parametrize("prompt, text, ids", [
    ("hello", "hello", None),
    (["hello"], "hello", None),
    ([3, 4, 5], None, [3, 4, 5]),
    ([[0, 7]], None, [0, 7]),
])
def test_prompt_forms(prompt, text, ids):
    c = completion(prompt=prompt)
    assert c.prompt_text() == text and c.prompt_ids() == ids


@pytest.mark.parametrize("prompt, words", [
    ([], "prompt must not be empty"),
    ([[]], "prompt must not be empty"),
    (["a", "b"], "one prompt per request, got 2"),
    ([[1], [2]], "one prompt per request, got 2"),
    ([1, -2], "token ids must be >= 0"),
    ([[INT64]], "token ids must be >= 0"),
])
def test_prompt_refusals(prompt, words):
    param, message = refusal(completion, prompt=prompt)
    assert param == "prompt" and words in message


# -- chat
@pytest.mark.parametrize("kw, param, words", [
    ({"messages": []}, "messages", "messages must not be empty"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}]}, "messages[1].role",
     "role 'robot' is not supported; use one of system, developer, user, assistant"),
    ({"messages": [{"role": "tool", "content": "b"}]}, "messages[0].role",
     "role 'tool' is not supported (tools are not supported); use one of"),
    ({"messages": [{"role": "function", "content": "b"}]}, "messages[0].role", "(tools are not supported)"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url"}]}]},
     "messages[0].content[1]", "content part of type 'image_url' is not supported (text only)"),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content[0]",
     "content part of type 'text' is not supported (text only)"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]}]}, "messages[0].tool_calls",
     "tool calls are not supported by this server"),
    ({"logprobs": True}, "logprobs", "logprobs are not supported by this server"),
    ({"top_logprobs": 2}, "logprobs", "logprobs are not supported by this server"),
    ({"tools": [{"type": "function"}]}, "tools", "tools are not supported by this server"),
    ({"tool_choice": "auto"}, "tool_choice", "tools are not supported by this server"),
    ({"tool_choice": {"type": "function"}}, "tool_choice", "tools are not supported"),
    ({"functions": [{"name": "f"}]}, "functions", "functions are not supported by this server"),
    ({"function_call": "auto"}, "function_call", "functions are not supported by this server"),
    ({"function_call": "none"}, "function_call", "functions are not supported"),
    ({"response_format": {"type": "json_object"}}, "response_format",
     "response_format 'json_object' is not supported by this server (only text)"),
    ({"response_format": {"type": "json_schema", "json_schema": {}}}, "response_format", "'json_schema'"),
    ({"max_completion_tokens": 0}, "max_completion_tokens", ""),
])
def test_chat_refusals(kw, param, words):
    got_param, message = refusal(chat, **kw)
    assert got_param == param and words in message


def test_chat_allowed_at_the_edges():
    assert chat(tool_choice="none").tool_choice == "none" and chat(tools=[]).tools == []
    assert chat(functions=[]).functions == [] and chat(top_logprobs=0).top_logprobs == 0
    assert chat(response_format={"type": "text"}).response_format == {"type": "text"}
    assert chat(response_format={}).response_format == {}  # no type: text
    assert chat(messages=[{"role": "assistant", "content": "x", "tool_calls": []}]).messages[0].role == "assistant"
    for role in ("system", "developer", "user", "assistant"):
        assert chat(messages=[{"role": role, "content": "x"}]).messages[0].role == role


@pytest.mark.parametrize("kw, expected", [({}, None), ({"max_tokens": 5}, 5), ({"max_completion_tokens": 7}, 7),
                                          ({"max_tokens": 5, "max_completion_tokens": 7}, 7)])
def test_max_new_tokens_prefers_max_completion_tokens(kw, expected):
    assert chat(**kw).max_new_tokens() == expected


def test_template_messages():
    req = chat(messages=[
        {"role": "developer", "content": "be brief"},
        {"role": "system", "content": "sys"},
        {"role": "user", "content": [{"type": "text", "text": "line 1"}, {"type": "text", "text": "line 2"}],
         "name": "ann"},
        {"role": "assistant", "content": None},
        {"role": "user", "content": []},
    ])
    assert req.template_messages() == [
        {"role": "system", "content": "be brief"},
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "line 1\nline 2", "name": "ann"},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": ""},
    ]


def test_refusals_are_invalid_request_errors_with_the_message_alone():
    """errors.from_validation keeps the message and param of errors of type `invalid_request`."""
    with pytest.raises(pydantic.ValidationError) as err:
        completion(echo=True)
    (first,) = err.value.errors()
    assert first["type"] == "invalid_request"
    assert first["msg"] == "echo is not supported by this server"
    assert first["ctx"] == {"param": "echo", "message": "echo is not supported by this server"}
