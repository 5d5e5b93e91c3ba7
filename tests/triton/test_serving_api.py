"""`wide-export serve --repository` as a library (wide_export/serving/triton_server.py): started from Python with the
OpenAI API in front, it answers a completion, keeps Triton's HTTP off and its gRPC private as the command does,
and stop() leaves nothing running; options that cannot work are refused before anything starts."""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path

import pytest

from wide_export.base.errors import WideError
from wide_export.serving.triton_server import ServeOptions, start_serving

_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def test_start_serving_answers_and_stop_leaves_nothing_running(text_repo):
    from wide_export.tritonserver.server import free_port

    phases = []

    def stage(message):
        phases.append(message)
        import contextlib

        return contextlib.nullcontext()

    port = free_port()
    serving = start_serving(ServeOptions(text_repo, openai_port=port), stage=stage)
    try:
        assert phases == ["loading the tokenizer for the OpenAI API ...", "starting tritonserver ...",
                          "starting the OpenAI API ..."]
        assert not serving.server.http  # the OpenAI port is all other users reach
        assert serving.endpoints.grpc.startswith("unix:")
        body = json.dumps({"model": serving.frontend.models[0].name, "prompt": "Hello", "max_tokens": 3}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                         {"Content-Type": "application/json"})
        with _DIRECT.open(request, timeout=60) as answer:
            got = json.loads(answer.read())
        assert got["usage"]["completion_tokens"] == 3 and got["choices"][0]["text"]
        pid = serving.server.process.pid
    finally:
        serving.stop()
    with pytest.raises(OSError):
        _DIRECT.open(f"http://127.0.0.1:{port}/health", timeout=2)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_options_that_cannot_work_are_refused_before_anything_starts(tmp_path):
    never = tmp_path / "no-repository"
    with pytest.raises(WideError, match="also given to another endpoint"):
        start_serving(ServeOptions(never, openai_port=8123, grpc_port=8123))
    with pytest.raises(WideError, match="for the OpenAI API"):
        start_serving(ServeOptions(never, served_model_name="x"))
    assert not Path(never).exists()
