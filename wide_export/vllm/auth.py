"""`wide-vllm serve` with an API key: every route but /health guarded, not only vLLM's.

vLLM's own `--api-key` (or VLLM_API_KEY) guards only the /v1, /v2, /inference (and /cohere) prefixes:
/invocations (the same generation as /v1), /tokenize, /detokenize, /metrics and others stay open. With a key,
`wide-vllm serve` adds `--middleware wide_export.vllm.auth.GuardAll` (compat.serve_api_key) and hands the
keys over in KEYS_ENV: this middleware (frontend/auth.ApiKey) then asks for the key on every route but /health,
as `wide-export serve --api-key` does. OPTIONS passes, as in vLLM, for its CORS preflights (browsers send
them without the key)."""

from __future__ import annotations

import json
import os

from wide_export.base.api_key import ApiKey

KEYS_ENV = "WIDE_VLLM_API_KEYS"  # a JSON list of the keys, set by wide-vllm for the API server's processes


class GuardAll(ApiKey):
    open_methods = frozenset({"OPTIONS"})

    def __init__(self, app):
        try:
            keys = json.loads(os.environ.get(KEYS_ENV) or "[]")
        except ValueError:
            keys = []
        if not keys:
            raise ValueError(f"{__name__}.GuardAll needs the API keys in {KEYS_ENV} (wide-vllm serve --api-key "
                             "sets it)")
        super().__init__(app, keys)
