"""`wide-export serve --openai-port`: what fails before tritonserver starts (real command, subprocess)."""

from __future__ import annotations

import socket
import subprocess
import sys

from tests.frontend.test_repository import write_model
from tests.helpers import assert_one_line_error

CLI = [sys.executable, "-m", "wide_export"]


def serve(*args):
    return subprocess.run([*CLI, "serve", *args], capture_output=True, text=True, timeout=120)


def test_a_taken_openai_port_fails_at_once_in_one_line(tmp_path):
    write_model(tmp_path, "wide_llm")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        line = assert_one_line_error(serve("--repository", str(tmp_path), "--openai-port", str(port)))
    assert "already in use" in line and str(port) in line and "tritonserver" not in line


def test_served_model_name_needs_one_model_and_the_openai_port(tmp_path):
    write_model(tmp_path, "a_llm")
    line = assert_one_line_error(serve("--repository", str(tmp_path), "--served-model-name", "x"))
    assert "--openai-port" in line
    write_model(tmp_path, "b_llm")
    line = assert_one_line_error(serve("--repository", str(tmp_path), "--openai-port", "0",
                                       "--served-model-name", "x"))
    assert "a_llm" in line and "b_llm" in line


def test_openai_limits_need_the_openai_port_and_sensible_values(tmp_path):
    write_model(tmp_path, "wide_llm")
    for flag, value in (("--max-connections", "10"), ("--max-body-bytes", "4096")):
        line = assert_one_line_error(serve("--repository", str(tmp_path), flag, value))
        assert f"{flag} is for the OpenAI API" in line and "--openai-port" in line
    for flag, value, said in (("--max-connections", "0", "at least 1"), ("--max-body-bytes", "10", "too small")):
        line = assert_one_line_error(serve("--repository", str(tmp_path), "--openai-port", "0", flag, value))
        assert flag in line and said in line and "tritonserver" not in line
