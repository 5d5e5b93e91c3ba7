"""Request schemas of the OpenAI endpoints (pydantic), with the checks that need several fields.

Types are strict (a string is not a number, 1.0 is not an integer); unknown fields
are accepted and reported by the routes as ignored (clients send newer fields, as
vLLM allows). Parameters this server cannot honour are refused with a 400 naming
them rather than silently ignored: n > 1, best_of, logprobs, echo, suffix, tools and
functions, non-text response formats, penalties and logit_bias.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

MAX_STOP = 4  # as OpenAI
INT64 = 2**63
# Token counts travel to the generation model as int32 (TYPE_INT32): a larger value wrapped (2**32 + 3 became 3)
# or overflowed (2**64: a 500). Refused as out of range instead, before any work.
INT32_MAX = 2**31 - 1
CHAT_ROLES = ("system", "developer", "user", "assistant")


def refuse(param: str, message: str) -> PydanticCustomError:
    """A validation error whose `param` is named explicitly (cross-field checks)."""
    return PydanticCustomError("invalid_request", "{message}", {"param": param, "message": message})


def _unencodable(value: Any, path: str) -> Optional[str]:
    """The path of the first string in `value` that UTF-8 cannot encode (a lone surrogate, which JSON's
    \\ud800 escape can carry), or None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path
        return None
    if isinstance(value, dict):
        children = [(f"{path}.{k}" if path else str(k), k, v) for k, v in value.items()]
    elif isinstance(value, (list, tuple)):
        children = [(f"{path}[{i}]", None, v) for i, v in enumerate(value)]
    else:
        return None
    for where, key, item in children:
        found = _unencodable(key, where) or _unencodable(item, where)
        if found:
            return found
    return None


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class StreamOptions(_Model):
    include_usage: Optional[bool] = None


class SamplingRequest(_Model):
    """Fields shared by completions and chat completions."""

    model: Optional[str] = None
    temperature: Optional[float] = Field(None, ge=0, le=2)
    top_p: Optional[float] = Field(None, gt=0, le=1)
    seed: Optional[int] = Field(None, ge=-INT64, lt=INT64)
    stop: Union[str, List[str], None] = None
    stream: Optional[bool] = False
    stream_options: Optional[StreamOptions] = None
    n: Optional[int] = 1
    presence_penalty: Optional[float] = Field(None, ge=-2, le=2)
    frequency_penalty: Optional[float] = Field(None, ge=-2, le=2)
    logit_bias: Optional[Dict[str, float]] = None
    user: Optional[str] = None
    # vLLM extras
    ignore_eos: Optional[bool] = False
    stop_token_ids: Optional[List[int]] = None
    return_token_ids: Optional[bool] = False

    @model_validator(mode="after")
    def _check_common(self):
        bad = _unencodable(self.model_dump(), "")
        if bad is not None:  # a lone surrogate: UnicodeEncodeError (a 500) on the way to the tokenizer
            raise refuse(bad, "the text is not valid Unicode (a lone surrogate \\ud800-\\udfff); send UTF-8 text")
        if self.n is not None and self.n != 1:
            raise refuse("n", f"n={self.n} is not supported: this server returns one choice per request (n=1)")
        stops = self.stop_list()
        if len(stops) > MAX_STOP:
            raise refuse("stop", f"at most {MAX_STOP} stop sequences, got {len(stops)}")
        if any(s == "" for s in stops):
            raise refuse("stop", "stop sequences must not be empty")
        if self.stream_options is not None and not self.stream:
            raise refuse("stream_options", "stream_options is only allowed when stream is true")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                raise refuse(name, f"{name} is not supported by this server (only 0)")
        if self.logit_bias:
            raise refuse("logit_bias", "logit_bias is not supported by this server")
        for i, tid in enumerate(self.stop_token_ids or ()):
            if not 0 <= tid < INT64:
                raise refuse(f"stop_token_ids[{i}]", f"token id {tid} is out of range")
        return self

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


class CompletionRequest(SamplingRequest):
    """POST /v1/completions."""

    prompt: Union[str, List[str], List[int], List[List[int]]]
    max_tokens: Optional[int] = Field(16, ge=1, le=INT32_MAX)
    best_of: Optional[int] = None
    echo: Optional[bool] = False
    logprobs: Optional[int] = None
    suffix: Optional[str] = None

    @model_validator(mode="after")
    def _check_completion(self):
        prompt = self.prompt
        if isinstance(prompt, list):
            if not prompt:
                raise refuse("prompt", "prompt must not be empty")
            if isinstance(prompt[0], (str, list)) and len(prompt) > 1:
                raise refuse("prompt", f"one prompt per request, got {len(prompt)}")
            if isinstance(prompt[0], list) and not prompt[0]:
                raise refuse("prompt", "prompt must not be empty")
            ids = prompt[0] if isinstance(prompt[0], list) else prompt
            if ids and isinstance(ids[0], int) and any(not 0 <= t < INT64 for t in ids):
                raise refuse("prompt", "token ids must be >= 0")
        if self.best_of is not None and self.best_of != 1:
            raise refuse("best_of", "best_of is not supported by this server (only 1)")
        if self.echo:
            raise refuse("echo", "echo is not supported by this server")
        if self.logprobs is not None:
            raise refuse("logprobs", "logprobs are not supported by this server")
        if self.suffix:
            raise refuse("suffix", "suffix is not supported by this server")
        return self

    def prompt_text(self) -> Optional[str]:
        """The prompt when it is text, else None."""
        if isinstance(self.prompt, str):
            return self.prompt
        return self.prompt[0] if isinstance(self.prompt[0], str) else None

    def prompt_ids(self) -> Optional[list[int]]:
        """The prompt when it is token ids, else None."""
        if isinstance(self.prompt, str) or isinstance(self.prompt[0], str):
            return None
        return list(self.prompt[0]) if isinstance(self.prompt[0], list) else list(self.prompt)  # type: ignore[arg-type]


class ContentPart(_Model):
    type: str
    text: Optional[str] = None


class ChatMessage(_Model):
    role: str
    content: Union[str, List[ContentPart], None] = None
    name: Optional[str] = None


class ChatCompletionRequest(SamplingRequest):
    """POST /v1/chat/completions."""

    messages: List[ChatMessage]
    max_tokens: Optional[int] = Field(None, ge=1, le=INT32_MAX)  # deprecated by OpenAI: max_completion_tokens
    max_completion_tokens: Optional[int] = Field(None, ge=1, le=INT32_MAX)
    logprobs: Optional[bool] = False
    top_logprobs: Optional[int] = None
    tools: Optional[List[Any]] = None
    tool_choice: Optional[Any] = None
    functions: Optional[List[Any]] = None
    function_call: Optional[Any] = None
    response_format: Optional[Dict[str, Any]] = None

    @model_validator(mode="after")
    def _check_chat(self):
        if not self.messages:
            raise refuse("messages", "messages must not be empty")
        for i, msg in enumerate(self.messages):
            if msg.role not in CHAT_ROLES:
                hint = " (tools are not supported)" if msg.role in ("tool", "function") else ""
                raise refuse(f"messages[{i}].role", f"role {msg.role!r} is not supported{hint}; "
                                                    f"use one of {', '.join(CHAT_ROLES)}")
            if isinstance(msg.content, list):
                for j, part in enumerate(msg.content):
                    if part.type != "text" or part.text is None:
                        raise refuse(f"messages[{i}].content[{j}]",
                                     f"content part of type {part.type!r} is not supported (text only)")
            if getattr(msg, "model_extra", None) and msg.model_extra.get("tool_calls"):
                raise refuse(f"messages[{i}].tool_calls", "tool calls are not supported by this server")
        if self.logprobs or self.top_logprobs:
            raise refuse("logprobs", "logprobs are not supported by this server")
        if self.tools:
            raise refuse("tools", "tools are not supported by this server")
        if self.tool_choice not in (None, "none"):
            raise refuse("tool_choice", "tools are not supported by this server")
        if self.functions or self.function_call is not None:
            raise refuse("functions" if self.functions else "function_call",
                         "functions are not supported by this server")
        if self.response_format is not None and self.response_format.get("type", "text") != "text":
            raise refuse("response_format", f"response_format {self.response_format.get('type')!r} is not "
                                            "supported by this server (only text)")
        return self

    def max_new_tokens(self) -> Optional[int]:
        """max_completion_tokens over the deprecated max_tokens; None: the rest of the context."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def template_messages(self) -> list[dict[str, str]]:
        """Messages as chat templates take them: text content, `developer` as `system`."""
        out = []
        for msg in self.messages:
            if isinstance(msg.content, list):
                content = "\n".join(part.text or "" for part in msg.content)
            else:
                content = msg.content or ""
            item = {"role": "system" if msg.role == "developer" else msg.role, "content": content}
            if msg.name:
                item["name"] = msg.name
            out.append(item)
        return out
