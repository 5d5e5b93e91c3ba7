"""Serving benchmark: the onnxruntime flavour behind a real tritonserver versus
direct ONNX Runtime calls (same decode loop, same session settings), 1 and 8
concurrent clients, in one run; then streaming requests arriving staggered
(seeded exponential gaps, different lengths) served with static batching and with
in-flight batching.

Numbers, not pass/fail: tokens/s over the wall time of each scenario and the
p50/p99 of per-request latency (staggered: from sending to the last token, and
time to the first token).
"""

from __future__ import annotations

import http.client
import json
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from wide_export.cli_process import export_onnx_cli
from wide_export.errors import WideError

CLIENT_COUNTS = (1, 8)


@dataclass
class ServingBenchConfig:
    """What to measure."""

    onnx: Optional[Path] = None  # None: export the demo model into a temp folder
    requests: int = 8  # per client
    prompt_len: int = 16
    new_tokens: int = 16
    protocol: str = "grpc"
    seed: int = 0
    output: Path = Path("bench-results/serving.json")
    staggered: int = 16  # streaming requests for the static vs in-flight comparison; 0 skips it
    arrival_ms: float = 10.0  # mean gap between their arrivals


@dataclass
class Scenario:
    """One measured scenario."""

    name: str
    clients: int
    requests: int
    tokens: int
    wall_s: float
    latencies_ms: list = field(default_factory=list, repr=False)
    first_token_ms: list = field(default_factory=list, repr=False)

    def summary(self) -> dict:
        lat = np.asarray(self.latencies_ms)
        out = {"name": self.name, "clients": self.clients, "requests": self.requests, "tokens": self.tokens,
               "wall_s": round(self.wall_s, 4), "tokens_per_s": round(self.tokens / self.wall_s, 2),
               "p50_ms": round(float(np.percentile(lat, 50)), 3), "p99_ms": round(float(np.percentile(lat, 99)), 3)}
        if self.first_token_ms:
            first = np.asarray(self.first_token_ms)
            out["first_token_p50_ms"] = round(float(np.percentile(first, 50)), 3)
            out["first_token_p99_ms"] = round(float(np.percentile(first, 99)), 3)
        return out


def run_clients(clients: int, requests: int, work: Callable[[int, int], int], name: str,
                setup: Optional[Callable[[int], None]] = None) -> Scenario:
    """Run `work(client, i) -> new tokens` from `clients` threads, timing each call.

    `setup(client)` runs in each thread before the clock starts (connections, warm-up).
    """
    latencies: list[float] = []
    tokens = [0] * clients
    errors: list[BaseException] = []
    lock = threading.Lock()
    ready = threading.Barrier(clients + 1)

    def client(c: int) -> None:
        try:
            if setup is not None:
                setup(c)
        except BaseException as err:  # noqa: BLE001 - re-raised in the caller thread
            errors.append(err)
        ready.wait()
        if errors:
            return
        try:
            for i in range(requests):
                start = time.perf_counter()
                tokens[c] += work(c, i)
                with lock:
                    latencies.append((time.perf_counter() - start) * 1e3)
        except BaseException as err:  # noqa: BLE001 - re-raised in the caller thread
            errors.append(err)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    ready.wait()  # every client is set up: start the clock
    start = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    if errors:
        raise errors[0]
    return Scenario(name=name, clients=clients, requests=clients * requests, tokens=sum(tokens), wall_s=wall,
                    latencies_ms=latencies)


def _prompts(cfg: ServingBenchConfig, vocab: int, clients: int) -> np.ndarray:
    rng = np.random.default_rng(cfg.seed)
    return rng.integers(0, vocab, size=(clients, cfg.requests, cfg.prompt_len), dtype=np.int64)


def _measure(cfg: ServingBenchConfig, repo: Path) -> list[Scenario]:
    from wide_export.triton import generation_model as gm
    from wide_export.triton.client import GenerationClient
    from wide_export.triton.server import TritonServer

    version = repo / "wide_llm" / "1"
    settings = gm.Settings.load(str(version))
    step = gm.ort_step(str(version), settings)
    results = []
    for clients in CLIENT_COUNTS:
        prompts = _prompts(cfg, settings.vocab_size, clients)

        def direct(c: int, i: int) -> int:
            return gm.generate(step, settings, [gm.Row(prompts[c, i], cfg.new_tokens)])[0].size

        for _ in range(3):  # warm-up
            direct(0, 0)
        results.append(run_clients(clients, cfg.requests, direct, "direct onnxruntime"))
    with TritonServer(repo) as server:
        url = server.endpoints.grpc if cfg.protocol == "grpc" else server.endpoints.http
        for clients in CLIENT_COUNTS:
            prompts = _prompts(cfg, settings.vocab_size, clients)
            # One client per thread, made in that thread: tritonclient.http (gevent) can't switch threads.
            local, opened, lock = threading.local(), [], threading.Lock()

            def connect(c: int) -> None:
                local.conn = GenerationClient(url, cfg.protocol)
                with lock:
                    opened.append(local.conn)
                local.conn.generate(prompts[c, 0], cfg.new_tokens)  # warm-up

            def served(c: int, i: int) -> int:
                return local.conn.generate(prompts[c, i], cfg.new_tokens).size

            try:
                results.append(run_clients(clients, cfg.requests, served, f"triton {cfg.protocol}", setup=connect))
            finally:
                for conn in opened:
                    conn.close()
    return results


def _stream_request(url: str, prompt: np.ndarray, n: int) -> list[float]:
    """One HTTP generate_stream request; the arrival time of each token (perf_counter)."""
    host, port = url.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=300)
    try:
        conn.request("POST", "/v2/models/wide_llm/generate_stream",
                     body=json.dumps({"input_ids": prompt.tolist(), "max_new_tokens": n}),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        times = []
        for line in resp:
            if line.startswith(b"data:"):
                if b'"error"' in line:
                    raise WideError(f"the server refused a benchmark request: {line[5:].decode().strip()}")
                times.append(time.perf_counter())
        if len(times) != n:
            raise WideError(f"a streamed request got {len(times)} of {n} tokens")
        return times
    finally:
        conn.close()


def staggered_plan(cfg: ServingBenchConfig, vocab: int, max_total: int) -> list[tuple[float, np.ndarray, int]]:
    """(arrival offset s, prompt, new tokens) per request: exponential gaps, lengths differ."""
    rng = np.random.default_rng([cfg.seed, 1])
    longest = max(1, min(4 * cfg.new_tokens, max_total - cfg.prompt_len))
    arrivals = np.cumsum(rng.exponential(cfg.arrival_ms / 1e3, size=cfg.staggered))
    return [(float(t), rng.integers(0, vocab, size=cfg.prompt_len, dtype=np.int64),
             int(rng.integers(max(1, longest // 8), longest + 1))) for t in arrivals]


def _measure_staggered(cfg: ServingBenchConfig, onnx: Path, tmp: Path) -> list[Scenario]:
    from wide_export.triton import generation_model as gm
    from wide_export.triton.repository import RepoOptions, generate_repository
    from wide_export.triton.server import TritonServer

    results = []
    for batching in ("static", "inflight"):
        repo = generate_repository(tmp / f"repo-{batching}", onnx=onnx,
                                   options=RepoOptions(streaming=True, batching=batching))
        settings = gm.Settings.load(str(repo / "wide_llm" / "1"))
        plan = staggered_plan(cfg, settings.vocab_size, settings.max_total_tokens)
        with TritonServer(repo) as server:
            url = server.endpoints.http
            for _ in range(2):  # warm-up
                _stream_request(url, plan[0][1], plan[0][2])
            latencies, firsts, errors = [0.0] * len(plan), [0.0] * len(plan), []
            start = time.perf_counter()

            def one(i: int) -> None:
                offset, prompt, n = plan[i]
                time.sleep(max(0.0, start + offset - time.perf_counter()))
                sent = time.perf_counter()
                try:
                    times = _stream_request(url, prompt, n)
                except BaseException as err:  # noqa: BLE001 - re-raised below
                    errors.append(err)
                    return
                latencies[i], firsts[i] = (times[-1] - sent) * 1e3, (times[0] - sent) * 1e3

            threads = [threading.Thread(target=one, args=(i,)) for i in range(len(plan))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall = time.perf_counter() - start
            if errors:
                raise errors[0]
        results.append(Scenario(name=f"{batching} batching", clients=len(plan), requests=len(plan),
                                tokens=sum(n for _, _, n in plan), wall_s=wall, latencies_ms=latencies,
                                first_token_ms=firsts))
    return results


def run_serving_bench(cfg: ServingBenchConfig) -> dict:
    """Measure, print a table, write JSON to cfg.output; returns the results."""
    from rich.console import Console
    from rich.table import Table

    from wide_export.triton.repository import generate_repository

    if cfg.protocol not in ("http", "grpc"):
        raise WideError(f"unknown protocol {cfg.protocol!r}", hint="http or grpc")
    if cfg.staggered < 0 or cfg.arrival_ms < 0:
        raise WideError("--staggered and --arrival-ms must be >= 0")
    console = Console(highlight=False)
    with tempfile.TemporaryDirectory(prefix="wide-bench-serving-") as tmp:
        onnx = cfg.onnx
        if onnx is None:
            with console.status("exporting the demo model ..."):
                onnx = export_onnx_cli(Path(tmp) / "onnx")
        repo = generate_repository(Path(tmp) / "repo", onnx=onnx)
        with console.status("measuring ..."):
            scenarios = _measure(cfg, repo)
        staggered = []
        if cfg.staggered:
            with console.status("measuring staggered streaming requests ..."):
                staggered = _measure_staggered(cfg, onnx, Path(tmp))
    rows = [s.summary() for s in scenarios]
    direct = {r["clients"]: r for r in rows if r["name"].startswith("direct")}
    for r in rows:
        r["tokens_per_s_vs_direct"] = round(r["tokens_per_s"] / direct[r["clients"]]["tokens_per_s"], 3)
    table = Table(title=f"serving: prompt {cfg.prompt_len}, {cfg.new_tokens} new tokens, "
                        f"{cfg.requests} requests per client")
    for col in ("path", "clients", "tokens/s", "vs direct", "p50 ms", "p99 ms"):
        table.add_column(col, justify="right" if col != "path" else "left")
    for r in rows:
        table.add_row(r["name"], str(r["clients"]), f"{r['tokens_per_s']:.1f}", f"{r['tokens_per_s_vs_direct']:.2f}x",
                      f"{r['p50_ms']:.1f}", f"{r['p99_ms']:.1f}")
    console.print(table)
    stag_rows = [s.summary() for s in staggered]
    if stag_rows:
        table = Table(title=f"{cfg.staggered} streaming requests, staggered arrivals (mean gap {cfg.arrival_ms:g} ms), "
                            f"prompt {cfg.prompt_len}, {staggered[0].tokens} new tokens in all")
        for col in ("batching", "tokens/s", "p50 ms", "p99 ms", "first token p50 ms", "first token p99 ms"):
            table.add_column(col, justify="right" if col != "batching" else "left")
        for r in stag_rows:
            table.add_row(r["name"], f"{r['tokens_per_s']:.1f}", f"{r['p50_ms']:.1f}", f"{r['p99_ms']:.1f}",
                          f"{r['first_token_p50_ms']:.1f}", f"{r['first_token_p99_ms']:.1f}")
        console.print(table)
    result = {"config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()}, "results": rows,
              "staggered": stag_rows}
    cfg.output.parent.mkdir(parents=True, exist_ok=True)
    cfg.output.write_text(json.dumps(result, indent=2) + "\n")
    console.print(f"wrote {cfg.output}")
    return result
