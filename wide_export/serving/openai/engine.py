"""What the routes need from a model server: the `Engine` protocol and the request / chunk types it speaks.

The engines themselves live a floor up, beside what they drive: serving/triton_engine.py (a running
tritonserver over gRPC), serving/cpu_engine.py (the CPU generator in this process). The routes know only this.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, AsyncIterator, Optional, Protocol, Sequence


if TYPE_CHECKING:
    pass

log = logging.getLogger("wide_export.serving.openai")

STOP = "stop"
LENGTH = "length"


@dataclass(frozen=True)
class GenerationRequest:
    """One generation, in the model's terms."""

    model: str  # served name
    prompt: Optional[str] = None  # text (the model tokenizes it) ...
    prompt_ids: Optional[Sequence[int]] = None  # ... or token ids
    add_special_tokens: bool = True
    max_tokens: Optional[int] = None  # None: the rest of the context
    temperature: Optional[float] = None  # None or 0: greedy
    top_p: Optional[float] = None
    seed: Optional[int] = None
    stop: Sequence[str] = ()
    stop_token_ids: Sequence[int] = ()
    ignore_eos: bool = False
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)


@dataclass(frozen=True)
class GenerationChunk:
    """What one model response adds: the text delta, the new token ids, and the counts so far."""

    text: str = ""
    token_ids: tuple[int, ...] = ()
    finish_reason: Optional[str] = None  # set on the last chunk: "stop" or "length"
    prompt_tokens: Optional[int] = None  # cumulative, as the model reports them
    completion_tokens: Optional[int] = None


class EngineError(Exception):
    """A failed generation. kind: 'invalid' (400), 'unavailable' (503) or 'internal' (500)."""

    def __init__(self, kind: str, message: str, param: Optional[str] = None):
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.param = param


class Engine(Protocol):
    """A model server behind the routes."""

    async def start(self) -> None:
        """Connect (called once, in the server's event loop, before the first request)."""

    async def close(self) -> None:
        """Disconnect (called once at shutdown)."""

    async def ready(self) -> bool:
        """True when every served model can take requests."""

    def models(self) -> list[str]:
        """Served model names."""

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        """Chunks until one with a finish_reason; raises EngineError. Closing it early cancels the request."""
