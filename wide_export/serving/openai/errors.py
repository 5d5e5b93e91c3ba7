"""Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.

Every failure the frontend answers goes through `OpenAIError` (or is turned into
one by the handlers installed by `install_handlers`): FastAPI's own 422
validation answers become 400s naming the offending field in `param`, unknown
routes 404s, anything unexpected a 500, all in the same shape, so the official
`openai` client raises its typed errors (`BadRequestError`, `NotFoundError`, ...).
"""

from __future__ import annotations

import logging
from typing import Any, Optional, Sequence

log = logging.getLogger("wide_export.serving.openai")

# status -> OpenAI error type
TYPES = {
    400: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    429: "rate_limit_exceeded",
    503: "service_unavailable",
    500: "server_error",
}


class OpenAIError(Exception):
    """An answer in OpenAI's error shape, with its HTTP status."""

    def __init__(self, status: int, message: str, param: Optional[str] = None, code: Optional[str] = None,
                 type: Optional[str] = None, retry_after: Optional[int] = None):
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after  # seconds, sent as `retry-after` (the openai client waits that long)
        self.message = message
        self.param = param
        self.code = code
        self.type = type or TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: Optional[str] = None, code: Optional[str] = None) -> OpenAIError:
    return OpenAIError(400, message, param=param, code=code)


def model_not_found(model: str) -> OpenAIError:
    return OpenAIError(404, f"The model `{model}` does not exist.", param="model", code="model_not_found")


_TYPE_TAGS = {"str", "int", "float", "bool", "dict", "list", "none", "function-after", "function-before"}


def param_of(loc: Sequence[Any]) -> Optional[str]:
    """A pydantic error location as OpenAI's `param`: ('body', 'messages', 0, 'role') -> 'messages[0].role'."""
    parts = list(loc)
    if parts and parts[0] == "body":
        parts = parts[1:]
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif out and ("[" in str(part) or str(part) in _TYPE_TAGS):
            continue  # pydantic's union-member tags (`str`, `list[int]`, ...), not fields
        else:
            out += ("." if out else "") + str(part)
    return out or None


def from_validation(errors: Sequence[dict]) -> OpenAIError:
    """The first pydantic/FastAPI validation error as a 400 naming its field."""
    if not errors:
        return bad_request("invalid request")
    err = errors[0]
    ctx = err.get("ctx") or {}
    if err.get("type") == "json_invalid":
        return bad_request(f"the request body is not valid JSON: {ctx.get('error', err.get('msg'))}")
    param = ctx.get("param") or param_of(err.get("loc", ()))
    if param is None and err.get("type") in ("model_attributes_type", "dict_type", "model_type"):
        return bad_request("the request body must be a JSON object")
    if err.get("type") == "invalid_request":
        return bad_request(str(err.get("msg")), param=param)
    # A union (stop: str | list[str], ...) fails once per member: say what each wanted.
    same = [e for e in errors if (e.get("ctx") or {}).get("param", param_of(e.get("loc", ()))) == param]
    messages = list(dict.fromkeys(str(e.get("msg", "invalid value")).removeprefix("Value error, ") for e in same))
    message = " or ".join(messages) if len(messages) <= 3 else messages[0]
    return bad_request(f"{param}: {message}" if param else message, param=param)


def install_handlers(app) -> None:
    """Answer every error in OpenAI's shape (FastAPI's 422s become 400s)."""
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException

    def respond(err: OpenAIError) -> JSONResponse:
        headers = {"retry-after": str(err.retry_after)} if err.retry_after is not None else None
        return JSONResponse(err.body(), status_code=err.status, headers=headers)

    @app.exception_handler(OpenAIError)
    async def _openai(_request, err: OpenAIError):
        return respond(err)

    @app.exception_handler(RequestValidationError)
    async def _validation(_request, err: RequestValidationError):
        return respond(from_validation(err.errors()))

    @app.exception_handler(HTTPException)
    async def _http(request, err: HTTPException):
        if err.status_code == 404:
            return respond(OpenAIError(404, f"no route {request.method} {request.url.path}", code="not_found"))
        return respond(OpenAIError(err.status_code, str(err.detail)))

    @app.exception_handler(Exception)
    async def _unexpected(_request, err: Exception):
        log.exception("unexpected error in the OpenAI frontend")
        return respond(OpenAIError(500, f"internal error: {type(err).__name__}: {err}"))
