"""The OpenAI-compatible routes: /v1/models, /v1/completions, /v1/chat/completions, /health.

The routes turn a request into a `GenerationRequest`, run it on the `Engine` and
answer in OpenAI's shapes, whole or as server-sent events. A stream's first model
response is awaited before the answer starts, so a request the model refuses still
gets its HTTP status (400, 503, ...); an error after that goes out in the stream as
`data: {"error": ...}` followed by `data: [DONE]`. A client that disconnects cancels
its request (`sse.until_disconnect`, `sse.EventStream`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator, Optional, Sequence

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from wide_export.serving.openai import sizes
from wide_export.serving.openai.admission import FairQueue, RequestPolicy, Ticket, client_of
from wide_export.serving.openai.engine import Engine, EngineError, GenerationChunk, GenerationRequest
from wide_export.serving.openai.errors import OpenAIError, bad_request, from_validation, install_handlers, model_not_found
from wide_export.serving.openai.models import ServedModel
from wide_export.serving.openai.protocol import ChatCompletionRequest, CompletionRequest, SamplingRequest
from wide_export.serving.openai.sse import (DONE, ClientGone, EventStream, ShuttingDown, event, unless_closing,
                                      until_disconnect)

log = logging.getLogger("wide_export.serving.openai")

# OpenAI's default when a request has no temperature: sampling at 1.0 (send temperature=0 for greedy).
DEFAULT_TEMPERATURE = 1.0
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions (in the schema)
OWNER = "wide-export"
SHUTTING_DOWN = "the server is shutting down; retry on another server or later"


def text_of(model: ServedModel):
    """The model's chat.ModelText (one without a tokenizer when none was loaded)."""
    if model.text is None:
        from wide_export.serving.openai.chat import ModelText

        model.text = ModelText(missing="this model has no tokenizer: only token-id prompts to /v1/completions "
                                       "are served")
    return model.text


def error_of(err: EngineError) -> OpenAIError:
    status = {"invalid": 400, "unavailable": 503}.get(err.kind, 500)
    return OpenAIError(status, err.message, param=err.param)


@dataclass
class _Kind:
    """What differs between the two generation endpoints' answers."""

    chat: bool
    prefix: str
    object: str
    chunk_object: str


_COMPLETION = _Kind(False, "cmpl-", "text_completion", "text_completion")
_CHAT = _Kind(True, "chatcmpl-", "chat.completion", "chat.completion.chunk")


class _Call:
    """One generation request on its way to an answer."""

    def __init__(self, kind: _Kind, body: SamplingRequest, model: str, gen: GenerationRequest):
        self.kind, self.body, self.model, self.gen = kind, body, model, gen
        self.id = kind.prefix + gen.request_id
        self.created = int(time.time())
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.ticket: Optional[Ticket] = None  # the model slot it holds (admission.FairQueue)
        self.closing = None  # asyncio.Event set when the server stops

    def release(self) -> None:
        if self.ticket is not None:
            self.ticket.release()

    def count(self, chunk: GenerationChunk) -> None:
        if chunk.prompt_tokens is not None:
            self.prompt_tokens = chunk.prompt_tokens
        if chunk.completion_tokens is not None:
            self.completion_tokens = chunk.completion_tokens
        else:
            self.completion_tokens += len(chunk.token_ids)

    def usage(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}

    def head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    # -- whole answers
    def full(self, chunks: list[GenerationChunk]) -> dict[str, Any]:
        text = "".join(c.text for c in chunks)
        finish = next((c.finish_reason for c in reversed(chunks) if c.finish_reason), None)
        if self.kind.chat:
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text},
                                      "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        if self.body.return_token_ids:
            choice["token_ids"] = [t for c in chunks for t in c.token_ids]
        return {**self.head(self.kind.object), "choices": [choice], "usage": self.usage(),
                "system_fingerprint": None}

    # -- streamed answers
    def chunk(self, content: Optional[str], finish: Optional[str], token_ids=None, role: bool = False
              ) -> dict[str, Any]:
        if self.kind.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else (
                {"content": content} if content else {})
            choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": content or "", "logprobs": None, "finish_reason": finish}
        if self.body.return_token_ids and token_ids is not None:
            choice["token_ids"] = list(token_ids)
        out = {**self.head(self.kind.chunk_object), "choices": [choice], "system_fingerprint": None}
        if self.body.include_usage():
            out["usage"] = None
        return out

    def usage_chunk(self) -> dict[str, Any]:
        return {**self.head(self.kind.chunk_object), "choices": [], "usage": self.usage(),
                "system_fingerprint": None}

    async def events(self, first: GenerationChunk, rest: AsyncIterator[GenerationChunk]) -> AsyncIterator[str]:
        """SSE events: (chat: a role-only delta,) one chunk per model response, usage, [DONE]."""
        try:
            if self.kind.chat:
                yield event(self.chunk(None, None, token_ids=(), role=True))
            chunk: Optional[GenerationChunk] = first
            while chunk is not None:
                self.count(chunk)
                # completions: one chunk per token; chat: only chunks with text (unless token ids are asked for)
                send = bool(chunk.text or chunk.finish_reason) or (
                    bool(chunk.token_ids) and (not self.kind.chat or bool(self.body.return_token_ids)))
                if send:
                    yield event(self.chunk(chunk.text, chunk.finish_reason, chunk.token_ids))
                if chunk.finish_reason:
                    break
                chunk = await unless_closing(anext(rest, None), self.closing)
            if self.body.include_usage():
                yield event(self.usage_chunk())
        except ShuttingDown:  # a graceful stop: the stream ends with an error event and [DONE], not a cut
            yield event(OpenAIError(503, SHUTTING_DOWN).body())
        except EngineError as err:
            yield event(error_of(err).body())
        except Exception as err:  # noqa: BLE001 - the stream has started: report it in the stream
            log.exception("error while streaming a generation")
            yield event(OpenAIError(500, f"internal error: {type(err).__name__}: {err}").body())
        finally:
            try:
                await rest.aclose()  # stops the engine request when the client went away
            finally:
                self.release()
        yield DONE


async def parse_body(request: Request, schema, max_items: Optional[int] = None):
    """The request body as `schema`, decoded and validated on a worker thread: 10^5 chat messages took a
    second to validate, which on the event loop held /health and every other request. pydantic holds the
    GIL while it validates a list, so a list of messages or token ids longer than `max_items` (the longest
    context served: sizes.py refuses it anyway) is refused before validation."""
    raw = await request.body()

    def work():
        import json

        from pydantic import ValidationError

        try:
            data = json.loads(raw)
        except json.JSONDecodeError as err:
            raise from_validation([{"type": "json_invalid", "loc": ("body", err.pos), "msg": "JSON decode error",
                                    "ctx": {"error": err.msg}}]) from None
        except (ValueError, RecursionError) as err:  # deep nesting, bad UTF-8
            raise bad_request(f"the request body is not valid JSON: {type(err).__name__}") from None
        if max_items is not None and isinstance(data, dict):
            for key in ("messages", "prompt"):
                items = data.get(key)
                if isinstance(items, list) and len(items) == 1 and isinstance(items[0], list):
                    items = items[0]  # [[ids]]
                if isinstance(items, list) and len(items) > max_items:
                    raise bad_request(f"{len(items)} {'messages' if key == 'messages' else 'prompt items'} cannot "
                                      f"fit this server's longest context of {max_items} tokens", param=key,
                                      code="context_length_exceeded")
        try:
            return schema.model_validate(data)
        except ValidationError as err:
            raise from_validation(err.errors(include_url=False)) from None

    return await run_in_threadpool(work)


def begin_shutdown(app: FastAPI) -> None:
    """From any thread: what waits or streams ends now, with a 503 or an error event and [DONE]."""
    loop, closing = getattr(app.state, "loop", None), getattr(app.state, "closing", None)
    if loop is not None and closing is not None and not loop.is_closed():
        loop.call_soon_threadsafe(closing.set)


def create_app(engine: Engine, models: Sequence[ServedModel], policy: Optional[RequestPolicy] = None) -> FastAPI:
    """The FastAPI app serving `models` through `engine` (started and closed with the app).

    `policy`: the operator's caps (max_tokens per request) and how requests share each model's slots
    (admission.py). `app.state.closing` (an asyncio.Event, set by `begin_shutdown`) ends what still waits
    or streams with a 503 / an error event and [DONE], so a graceful stop cuts nothing mid-way."""
    by_name = {m.name: m for m in models}
    policy = policy or RequestPolicy()
    queues = {m.name: FairQueue(m.slots, policy.per_client, policy.max_waiting) for m in models}
    lengths = [m.max_model_len for m in models]
    max_items = max(lengths) if lengths and None not in lengths else None  # parse_body

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.closing = asyncio.Event()
        app.state.loop = asyncio.get_running_loop()
        try:
            await engine.start()
        except Exception as err:  # noqa: BLE001 - the runner reports it as one line and stops the server
            app.state.startup_error = err
        try:
            yield
        finally:
            await engine.close()

    app = FastAPI(title="wide-export OpenAI-compatible API", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.startup_error = None
    app.state.closing = None  # made on the server's loop at startup (lifespan)
    app.state.queues = queues  # per model: what runs and waits (tests, and a look from outside)
    install_handlers(app)

    def card(m: ServedModel) -> dict[str, Any]:
        out: dict[str, Any] = {"id": m.name, "object": "model", "created": 0, "owned_by": OWNER, "root": m.triton_name}
        if m.max_model_len is not None:
            out["max_model_len"] = m.max_model_len
        return out

    def resolve(name: Optional[str]) -> ServedModel:
        if name is None:
            if len(by_name) == 1:
                return next(iter(by_name.values()))
            raise bad_request("model is required (this server serves several)", param="model")
        if name not in by_name:
            raise model_not_found(name)
        return by_name[name]

    def common(body: SamplingRequest, model: ServedModel, **kw) -> GenerationRequest:
        ignored = sorted(body.model_extra or {})
        if ignored:
            # escaped: a field name is the client's text, and a newline in it would forge a log line
            log.warning("ignored request fields: %s", ", ".join(ascii(name) for name in ignored))
        return GenerationRequest(
            model=model.name,
            temperature=DEFAULT_TEMPERATURE if body.temperature is None else body.temperature,
            top_p=body.top_p, seed=body.seed, stop=tuple(body.stop_list()),
            stop_token_ids=tuple(body.stop_token_ids or ()), ignore_eos=bool(body.ignore_eos),
            request_id=uuid.uuid4().hex, **kw)

    def capped(requested: Optional[int], param: str) -> Optional[int]:
        """max_tokens under the operator's cap (a 400 above it; the cap when none is asked for)."""
        if policy.max_tokens is None:
            return requested
        if requested is None:
            return policy.max_tokens
        if requested > policy.max_tokens:
            raise bad_request(f"{param} {requested} is over this server's limit of {policy.max_tokens} tokens "
                              "a request", param=param)
        return requested

    async def run(request: Request, call: _Call, model: ServedModel) -> Response:
        closing = app.state.closing
        call.closing = closing
        try:
            # the peer's uid is read from /proc/net/tcp (a row per open connection): not on the event loop
            client = await run_in_threadpool(client_of, request.scope, call.body.user)
            call.ticket = await until_disconnect(request, queues[model.name].acquire(client), closing)
        except ClientGone:
            return Response(status_code=499)
        except ShuttingDown:
            raise OpenAIError(503, SHUTTING_DOWN) from None
        chunks = engine.generate(call.gen)
        streaming = False
        try:
            try:
                first = await until_disconnect(request, anext(chunks), closing)
            except StopAsyncIteration:
                first = GenerationChunk(finish_reason="stop")
            if call.body.stream:
                streaming = True  # the stream closes the generation and gives the slot back
                return EventStream(call.events(first, chunks), after=call.release)
            collected = [first]

            async def rest() -> None:
                while not collected[-1].finish_reason:
                    nxt = await anext(chunks, None)
                    if nxt is None:
                        break
                    collected.append(nxt)

            await until_disconnect(request, rest(), closing)
        except ClientGone:
            await chunks.aclose()
            return Response(status_code=499)
        except ShuttingDown:
            await chunks.aclose()
            raise OpenAIError(503, SHUTTING_DOWN) from None
        except EngineError as err:
            await chunks.aclose()
            raise error_of(err) from None
        except BaseException:
            await chunks.aclose()
            raise
        finally:
            if not streaming:
                call.release()
        await chunks.aclose()
        for c in collected:
            call.count(c)
        return JSONResponse(call.full(collected))

    @app.get("/health")
    async def health():
        if await engine.ready():
            return {"status": "ok"}
        raise OpenAIError(503, "the model server is not ready")

    @app.get("/v1/models")
    async def list_models():
        return {"object": "list", "data": [card(m) for m in models]}

    @app.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str):
        return card(resolve(model_id))

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await parse_body(request, CompletionRequest, max_items)
        model = resolve(body.model)
        ids = body.prompt_ids()
        max_tokens = capped(body.max_tokens if body.max_tokens is not None else COMPLETIONS_DEFAULT_MAX_TOKENS,
                            "max_tokens")
        if ids is None:
            text = text_of(model)
            text.require_text("prompt")
            prompt = body.prompt_text() or ""
            sizes.check_text(len(prompt), model.max_model_len, text.max_token_chars)
            gen = common(body, model, prompt=prompt, add_special_tokens=True, max_tokens=max_tokens)
        else:
            sizes.check_ids(ids, model.max_model_len)
            gen = common(body, model, prompt_ids=ids, max_tokens=max_tokens)
        return await run(request, _Call(_COMPLETION, body, model.name, gen), model)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = await parse_body(request, ChatCompletionRequest, max_items)
        model = resolve(body.model)
        max_tokens = capped(body.max_new_tokens(), "max_completion_tokens" if body.max_completion_tokens is not None
                            else "max_tokens")
        text = text_of(model)
        messages = body.template_messages()
        sizes.check_messages(messages, model.max_model_len, text.max_token_chars)
        # jinja templating takes a while on long inputs: on a worker thread, so /health and others do not wait
        prompt = await run_in_threadpool(text.render_chat, messages)
        sizes.check_text(len(prompt), model.max_model_len, text.max_token_chars, param="messages")
        gen = common(body, model, prompt=prompt, add_special_tokens=False, max_tokens=max_tokens)
        return await run(request, _Call(_CHAT, body, model.name, gen), model)

    return app
