#!/usr/bin/env python3
"""Soak `wide-export serve --model DIR` with streams dropped mid-answer and watch the server's memory.

Starts the CPU server on the demo checkpoint (written to a temporary folder: DEMO_SPEC, the model `wide-export
onnx` exports by default, plus the demo tokenizer), then N times: opens a streamed /v1/completions request on a
raw socket, reads the first few SSE chunks and closes the connection (the server sees the client go away in the
middle of the answer). Every K disconnects it samples the server process's RSS (/proc/PID/status VmRSS) and
prints one row; --csv writes the rows too. Not part of the test suite (docs/cpu.md, "Memory under client
disconnects", has its figures).

    .venv-test/bin/python scripts/soak-disconnects.py -n 200 --every 50          # the rate first
    .venv-test/bin/python scripts/soak-disconnects.py -n 10000 --every 500 --csv soak.csv
    .venv-test/bin/python scripts/soak-disconnects.py -n 2000 --env MALLOC_ARENA_MAX=2

--text sends a text prompt (the tokenizer runs per request) instead of token ids; --concurrency C drops C
streams at a time (C connections open together); --model DIR soaks another checkpoint folder.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROMPT_IDS = [5, 9, 13, 2, 7, 11, 3]
PROMPT_TEXT = "Once upon a time, in a land far away,"


def demo_folder(where: Path, tokenizer: bool) -> Path:
    sys.path.insert(0, str(ROOT))
    from wide_export.model.demo import DEMO_SPEC
    from wide_export.model.synthetic import write_checkpoint

    folder = write_checkpoint(where / "demo", DEMO_SPEC)
    if tokenizer:
        from wide_export.model.demo_tokenizer import demo_tokenizer

        demo_tokenizer().save_pretrained(folder)
    return folder


def start_server(model: Path, env: dict[str, str], threads: int) -> tuple[subprocess.Popen, str, int]:
    cmd = [sys.executable, "-m", "wide_export", "serve", "--model", str(model), "--openai-port", "0",
           "--served-model-name", "wide", "--threads", str(threads)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "COLUMNS": "300", **env})
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            sys.exit(f"the server exited ({proc.returncode}): {proc.stderr.read()}")
        if "OpenAI http" in line:
            url = line.split("OpenAI ", 1)[1].split()[0]  # http://127.0.0.1:PORT/v1
            host, port = url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
            # the pipes are not read from here on: keep them from filling up
            threading.Thread(target=proc.stdout.read, daemon=True).start()
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            return proc, host, int(port)
    proc.kill()
    sys.exit("the server did not print its ready line in 180 s")


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def count(pid: int, what: str) -> int:
    """The server's threads (task) or open file descriptors (fd)."""
    return len(os.listdir(f"/proc/{pid}/{what}"))


def request_bytes(host: str, port: int, text: bool, max_tokens: int) -> bytes:
    body = {"model": "wide", "prompt": PROMPT_TEXT if text else PROMPT_IDS, "max_tokens": max_tokens,
            "stream": True, "temperature": 0.8, "ignore_eos": True}
    raw = json.dumps(body).encode()
    return (f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(raw)}\r\n\r\n").encode() + raw


def drop_one(host: str, port: int, payload: bytes, chunks: int) -> bool:
    """One streamed request, closed after `chunks` SSE events; True when it got that far."""
    with socket.create_connection((host, port), timeout=60) as sock:
        sock.sendall(payload)
        seen, buf = 0, b""
        while seen < chunks:
            data = sock.recv(65536)
            if not data:
                return False
            buf += data
            if b"\r\n\r\n" in buf and b" 200 " not in buf.split(b"\r\n", 1)[0]:
                return False  # refused (a 4xx / 5xx): not a stream
            seen = buf.count(b"data: ")
            if b"data: [DONE]" in buf:
                return False  # the answer ended before `chunks` events
    return True  # closed mid-answer


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=10000, help="streams to drop (default 10000)")
    ap.add_argument("--every", type=int, default=500, help="sample RSS every K disconnects (default 500)")
    ap.add_argument("--chunks", type=int, default=3, help="SSE events read before closing (default 3; a number "
                    "over --max-tokens reads whole answers: the control without disconnects)")
    ap.add_argument("--max-tokens", type=int, default=100, help="each request's budget (default 100)")
    ap.add_argument("--concurrency", type=int, default=1, help="streams open at once (default 1)")
    ap.add_argument("--threads", type=int, default=1, help="the server's --threads (default 1)")
    ap.add_argument("--text", action="store_true", help="text prompts (the tokenizer runs) instead of ids")
    ap.add_argument("--model", type=Path, help="checkpoint folder (default: the demo model in a temp folder)")
    ap.add_argument("--env", action="append", default=[], metavar="K=V", help="server environment, repeatable")
    ap.add_argument("--csv", type=Path, help="write the rows here too")
    args = ap.parse_args()
    env = dict(e.split("=", 1) for e in args.env)
    with tempfile.TemporaryDirectory(prefix="wide-soak-") as tmp:
        model = args.model or demo_folder(Path(tmp), tokenizer=True)
        proc, host, port = start_server(model, env, args.threads)
        payload = request_bytes(host, port, args.text, args.max_tokens)
        rows, failed, start = [], 0, time.monotonic()

        def sample(done: int) -> None:
            row = (done, round(rss_mb(proc.pid), 1), count(proc.pid, "task"), count(proc.pid, "fd"),
                   round(time.monotonic() - start, 1))
            rows.append(row)
            print(f"{row[0]:>8} {row[1]:>9.1f} {row[2]:>8} {row[3]:>5} {row[4]:>8.1f}", flush=True)

        try:
            for _ in range(3):  # warm-up: the first requests' one-off allocations before the first sample
                drop_one(host, port, payload, args.chunks)
            print(f"server pid {proc.pid}, {args.n} streams dropped after {args.chunks} chunks"
                  f"{', env ' + ' '.join(args.env) if args.env else ''}")
            print(f"{'dropped':>8} {'RSS MB':>9} {'threads':>8} {'fds':>5} {'s':>8}")
            sample(0)
            done = 0
            with ThreadPoolExecutor(args.concurrency) as pool:
                while done < args.n:
                    batch = min(args.every, args.n - done)
                    results = list(pool.map(lambda _: drop_one(host, port, payload, args.chunks), range(batch)))
                    failed += results.count(False)
                    done += batch
                    sample(done)
            if proc.poll() is not None:
                print(f"the server exited ({proc.returncode})")
                return 1
        finally:
            proc.terminate()
            proc.wait(30)
    elapsed = time.monotonic() - start
    print(f"{args.n} disconnects in {elapsed:.0f} s ({args.n / elapsed:.0f}/s); {failed} not dropped mid-answer; "
          f"RSS {rows[0][1]:.1f} -> {rows[-1][1]:.1f} MB")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["disconnects", "rss_mb", "threads", "fds", "seconds"])
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
