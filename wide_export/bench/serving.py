"""Serving benchmark: the onnxruntime flavour behind a real tritonserver versus
direct ONNX Runtime calls (same decode loop, same session settings), 1 and 8
concurrent clients, in one run.

Numbers, not pass/fail: tokens/s over the wall time of each scenario and the
p50/p99 of per-request latency.
"""

from __future__ import annotations

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


@dataclass
class Scenario:
    """One measured scenario."""

    name: str
    clients: int
    requests: int
    tokens: int
    wall_s: float
    latencies_ms: list = field(default_factory=list, repr=False)

    def summary(self) -> dict:
        lat = np.asarray(self.latencies_ms)
        return {"name": self.name, "clients": self.clients, "requests": self.requests, "tokens": self.tokens,
                "wall_s": round(self.wall_s, 4), "tokens_per_s": round(self.tokens / self.wall_s, 2),
                "p50_ms": round(float(np.percentile(lat, 50)), 3), "p99_ms": round(float(np.percentile(lat, 99)), 3)}


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


def run_serving_bench(cfg: ServingBenchConfig) -> dict:
    """Measure, print a table, write JSON to cfg.output; returns the results."""
    from rich.console import Console
    from rich.table import Table

    from wide_export.triton.repository import generate_repository

    if cfg.protocol not in ("http", "grpc"):
        raise WideError(f"unknown protocol {cfg.protocol!r}", hint="http or grpc")
    console = Console(highlight=False)
    with tempfile.TemporaryDirectory(prefix="wide-bench-serving-") as tmp:
        onnx = cfg.onnx
        if onnx is None:
            with console.status("exporting the demo model ..."):
                onnx = export_onnx_cli(Path(tmp) / "onnx")
        repo = generate_repository(Path(tmp) / "repo", onnx=onnx)
        with console.status("measuring ..."):
            scenarios = _measure(cfg, repo)
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
    result = {"config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()}, "results": rows}
    cfg.output.parent.mkdir(parents=True, exist_ok=True)
    cfg.output.write_text(json.dumps(result, indent=2) + "\n")
    console.print(f"wrote {cfg.output}")
    return result
