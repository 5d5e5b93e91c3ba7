"""The OpenAI API's key: `serve --api-key KEY` (or the WIDE_API_KEY environment variable), as vLLM's
`--api-key` / VLLM_API_KEY.

`ApiKey` is an ASGI middleware: with a key, every request but `GET /health` (a load balancer's probe) needs
`Authorization: Bearer KEY`, else a 401 in OpenAI's error shape before anything reads its body. vLLM guards
only its /v1 (and a few other) prefixes; here every other route is guarded, /metrics included. Keys are
compared as SHA-256 digests with hmac.compare_digest: the time taken says nothing of the key, not even its
length. `exposure_warning` is the line `serve` prints when the API listens beyond loopback without a key.

It lives in base/ because both OpenAI servers use it: ours (serving/openai/runner.py) and vLLM's
(vllm/auth.py); it needs nothing of wide_export but errors.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import os
from typing import Mapping, Optional

ENV = "WIDE_API_KEY"
OPEN_PATHS = frozenset({"/health"})


def api_key_from(flag: Optional[str], environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The key: --api-key, else WIDE_API_KEY (an empty variable is none); WideError for an empty flag."""
    if flag is not None:
        if not flag.strip():
            from wide_export.base.errors import WideError

            raise WideError("--api-key must not be empty", hint=f"pass a key, or omit --api-key (and unset {ENV}) "
                                                                "for an API without one")
        return flag
    value = (os.environ if environ is None else environ).get(ENV, "")
    return value if value.strip() else None


def is_loopback(host: str) -> bool:
    """Whether `host` (an address or a name) is this machine's loopback only; a name that does not resolve, or
    resolves to another address too, is not."""
    host = host.strip("[]")
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    import socket

    try:
        found = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except (OSError, UnicodeError):
        return False
    return bool(found) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in found)


def exposure_warning(host: str, key: Optional[str], what: str = "the OpenAI API", how: str = "--api-key KEY") -> \
        Optional[str]:
    """The warning line for an API listening on `host` beyond loopback without a key; None otherwise."""
    if key or is_loopback(host):
        return None
    return (f"warning: {what} listens on {host} without an API key: anyone who reaches this port can use the "
            f"model (pass {how} or set {ENV}, or listen on 127.0.0.1)")


def _digest(value: bytes) -> bytes:
    return hashlib.sha256(value).digest()


UNAUTHORIZED = json.dumps({"error": {
    "message": "a valid API key is required: send the header Authorization: Bearer <key>",
    "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}}).encode()


class ApiKey:
    """ASGI middleware: a request without `Authorization: Bearer <key>` (one of `keys`: a key or a list, as
    vLLM's --api-key K1 K2) gets a 401, but on OPEN_PATHS and for `open_methods`."""

    open_methods: frozenset = frozenset()

    def __init__(self, app, keys):
        keys = [keys] if isinstance(keys, str) else list(keys)
        if not keys or not all(isinstance(k, str) and k for k in keys):
            raise ValueError("an empty API key")
        self.app, self._digests = app, [_digest(k.encode("utf-8", "surrogateescape")) for k in keys]

    def allowed(self, headers) -> bool:
        given = None
        for name, value in headers:
            if name.lower() == b"authorization":
                given = value  # bytes, as sent: a key beyond ASCII is compared as its UTF-8
                break
        if given is None:
            return False
        scheme, _, token = given.strip().partition(b" ")
        # every key compared, whatever the scheme: the time taken says nothing of which one nearly matched
        digest, match = _digest(token.strip()), False
        for known in self._digests:
            match |= hmac.compare_digest(digest, known)
        return match and scheme.lower() == b"bearer"

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket") or scope["path"] in OPEN_PATHS \
                or scope.get("method") in self.open_methods or self.allowed(scope.get("headers") or ()):
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        await send({"type": "http.response.start", "status": 401, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(UNAUTHORIZED)).encode()),
            (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": UNAUTHORIZED, "more_body": False})
