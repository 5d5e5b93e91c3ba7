"""Serving benchmark: the onnxruntime flavour behind a real tritonserver versus
direct ONNX Runtime calls (same decode loop, same session settings), 1 and 8
concurrent clients, in one run; then streaming requests arriving staggered
(seeded exponential gaps, different lengths) served with static batching and with
in-flight batching. With `openai`, instead: the OpenAI-compatible frontend in front
of a streaming repository, driven through `/v1/completions` with `stream=True` by the
official `openai` client from C concurrent clients: time to first token, inter-token
latency and tokens/s (`openai_stats`).

Numbers, not pass/fail: tokens/s over the wall time of each scenario and the
p50/p99 of per-request latency (staggered: from sending to the last token, and
time to the first token). Every served request asks the server to ignore the
end-of-sequence id, and its token count is checked: a row that stopped early would
make the served paths do less work than the direct ones they are compared with.
Progress goes to stderr (wide_export.base.progress.Steps): one line per stage when piped.
"""

from __future__ import annotations

import http.client
import json
import re
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from wide_export.base.cli_process import export_onnx_cli
from wide_export.base.errors import WideError

CLIENT_COUNTS = (1, 8)

# progress(stage, completed=None, total=None), as wide_export.base.progress.Steps.update
Progress = Callable[..., None]


def _no_progress(stage: str, completed: Optional[int] = None, total: Optional[int] = None) -> None:
    pass


def counted(got: int, asked: int, what: str) -> int:
    """`got` when it is the `asked` number of new tokens, else a WideError: a request that stopped early would
    be measured as less work than the bench says it measures."""
    if got != asked:
        raise WideError(f"{what} got {got} of {asked} tokens although it asked the server to ignore the "
                        "end-of-sequence id")
    return got

# What the first table compares, printed under it and stored in the JSON: the paths run the same code on the
# same session settings; what differs is said, so a ratio is not read as "Triton makes onnxruntime faster".
COMPARES = ("direct onnxruntime = the generation model's own decode loop (generation_model.generate over "
            "ort_step: IOBinding, presents kept where ONNX Runtime wrote them) called in this process, one "
            "request per call, the same intra-op threads as the server's instance. direct onnxruntime, batched "
            "(several clients) = the same loop given the clients' requests of each round as one batch: what "
            "Triton's dynamic batcher does at best, without waiting for a batch to fill. triton = the same loop "
            "in tritonserver's Python stub, plus the protocol round trip; with several clients its dynamic "
            "batcher merges concurrent requests into one batch. 'vs best direct' divides by the faster direct "
            "row of the same client count.")


def direct_threads() -> int:
    """ONNX Runtime intra-op threads for both paths: one per CPU, as ONNX Runtime's default would pick, but
    explicit, so the server's instance and the direct session cannot differ."""
    import os

    return max(1, os.cpu_count() or 1)


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
    clients: tuple = CLIENT_COUNTS  # concurrent clients, one scenario each
    rounds: int = 3  # interleaved rounds of every path per client count (pooled; each round's tokens/s kept)
    openai: bool = False  # measure the OpenAI frontend (streaming /v1/completions) instead
    repository: Optional[Path] = None  # openai: serve this repository (default: a streaming one from `onnx`)
    base_port: Optional[int] = None  # tritonserver's HTTP / gRPC / metrics on base..base+2, the OpenAI API
    # on base+3 (all on 127.0.0.1); None: free ports the OS picks

    def server_ports(self) -> dict:
        """TritonServer's port arguments: the base port's range, or nothing (free ports)."""
        if self.base_port is None:
            return {}
        return {"http_port": self.base_port, "grpc_port": self.base_port + 1, "metrics_port": self.base_port + 2}

    @property
    def openai_port(self) -> int:
        return 0 if self.base_port is None else self.base_port + 3


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
    round_tokens_per_s: list = field(default_factory=list, repr=False)  # tokens/s of each round (merge_rounds)

    def summary(self) -> dict:
        lat = np.asarray(self.latencies_ms)
        out = {"name": self.name, "clients": self.clients, "requests": self.requests, "tokens": self.tokens,
               "wall_s": round(self.wall_s, 6), "tokens_per_s": round(self.tokens / self.wall_s, 2),
               "p50_ms": round(float(np.percentile(lat, 50)), 3), "p99_ms": round(float(np.percentile(lat, 99)), 3)}
        if self.round_tokens_per_s:
            out["round_tokens_per_s"] = self.round_tokens_per_s
        if self.first_token_ms:
            first = np.asarray(self.first_token_ms)
            out["first_token_p50_ms"] = round(float(np.percentile(first, 50)), 3)
            out["first_token_p99_ms"] = round(float(np.percentile(first, 99)), 3)
        return out


def run_clients(clients: int, requests: int, work: Callable[[int, int], int], name: str,
                setup: Optional[Callable[[int], None]] = None) -> Scenario:
    """Run `work(client, i) -> new tokens` from `clients` threads, timing each call.

    `setup(client)` runs in each thread before the clock starts (connections, warm-up). An interrupt
    (Ctrl-C / SIGTERM, raised in this thread) lets each client finish the call it is in and stop, then
    propagates: no thread is left inside ONNX Runtime or gRPC while the interpreter exits.
    """
    from wide_export.base.signals import shielded

    latencies: list[float] = []
    tokens = [0] * clients
    errors: list[BaseException] = []
    lock = threading.Lock()
    ready = threading.Barrier(clients + 1)
    stop = threading.Event()

    def client(c: int) -> None:
        try:
            if setup is not None:
                setup(c)
        except BaseException as err:  # noqa: BLE001 - re-raised in the caller thread
            errors.append(err)
        try:
            ready.wait()
        except threading.BrokenBarrierError:  # the caller was interrupted before the clock started
            return
        if errors:
            return
        try:
            for i in range(requests):
                if stop.is_set():
                    return
                start = time.perf_counter()
                tokens[c] += work(c, i)
                with lock:
                    latencies.append((time.perf_counter() - start) * 1e3)
        except BaseException as err:  # noqa: BLE001 - re-raised in the caller thread
            errors.append(err)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    try:
        ready.wait()  # every client is set up: start the clock
        start = time.perf_counter()
        for t in threads:
            t.join()
    except BaseException:
        stop.set()
        ready.abort()
        with shielded():  # a second signal while the clients finish their call is recorded, not raised
            for t in threads:
                t.join()
        raise
    wall = time.perf_counter() - start
    if errors:
        raise errors[0]
    return Scenario(name=name, clients=clients, requests=clients * requests, tokens=sum(tokens), wall_s=wall,
                    latencies_ms=latencies)


def run_batched(clients: int, requests: int, work: Callable[[int], int], name: str) -> Scenario:
    """`requests` rounds, each `work(i) -> new tokens` serving all clients' request i in one call; each of
    those requests waited the whole call."""
    latencies: list[float] = []
    tokens = 0
    start = time.perf_counter()
    for i in range(requests):
        t0 = time.perf_counter()
        tokens += work(i)
        latencies += [(time.perf_counter() - t0) * 1e3] * clients
    return Scenario(name=name, clients=clients, requests=clients * requests, tokens=tokens,
                    wall_s=time.perf_counter() - start, latencies_ms=latencies)


def _prompts(cfg: ServingBenchConfig, vocab: int, clients: int) -> np.ndarray:
    rng = np.random.default_rng(cfg.seed)
    return rng.integers(0, vocab, size=(clients, cfg.requests, cfg.prompt_len), dtype=np.int64)


def merge_rounds(rounds: list[Scenario]) -> Scenario:
    """One scenario from its rounds: requests, tokens, wall time and latencies pooled; tokens/s of each
    round kept (their spread shows how much the machine's load moved the numbers)."""
    first = rounds[0]
    out = Scenario(name=first.name, clients=first.clients, requests=sum(r.requests for r in rounds),
                   tokens=sum(r.tokens for r in rounds), wall_s=sum(r.wall_s for r in rounds),
                   latencies_ms=[x for r in rounds for x in r.latencies_ms])
    out.round_tokens_per_s = [round(r.tokens / r.wall_s, 2) for r in rounds]
    return out


def _measure(cfg: ServingBenchConfig, repo: Path, progress: Progress = _no_progress) -> list[Scenario]:
    """Per client count, `cfg.rounds` rounds of: direct, direct batched (several clients), triton (every other
    round in reverse order) -- interleaved with the server up, so a change of the machine's load hits every
    path alike. The direct loop never stops at an eos id (its rows have no stop ids); the served requests ask
    for ignore_eos, and their counts are checked."""
    from wide_export.tritonserver import generation_model as gm
    from wide_export.tritonserver.client import GenerationClient
    from wide_export.tritonserver.server import TritonServer

    version = repo / "wide_llm" / "1"
    settings = gm.Settings.load(str(version))
    step = gm.ort_step(str(version), settings, threads=direct_threads())  # IOBinding, as the server's
    results = []
    progress("starting tritonserver")
    with TritonServer(repo, **cfg.server_ports()) as server:
        url = server.endpoints.grpc if cfg.protocol == "grpc" else server.endpoints.http
        for clients in cfg.clients:
            stage = f"{clients} client{'s' if clients > 1 else ''}, direct and triton {cfg.protocol} paths"
            progress(f"{stage}, warm-up")
            prompts = _prompts(cfg, settings.vocab_size, clients)

            def direct(c: int, i: int, prompts=prompts) -> int:
                return gm.generate(step, settings, [gm.Row(prompts[c, i], cfg.new_tokens)])[0].size

            def batched(i: int, prompts=prompts, clients=clients) -> int:
                rows = [gm.Row(prompts[c, i], cfg.new_tokens) for c in range(clients)]
                return sum(t.size for t in gm.generate(step, settings, rows))

            # One client per thread, made in that thread: tritonclient.http (gevent) can't switch threads.
            local, opened, lock = threading.local(), [], threading.Lock()

            def connect(c: int, prompts=prompts, local=local, opened=opened, lock=lock) -> None:
                local.conn = GenerationClient(url, cfg.protocol)
                with lock:
                    opened.append(local.conn)
                local.conn.generate(prompts[c, 0], cfg.new_tokens, ignore_eos=True)  # warm-up

            def served(c: int, i: int, prompts=prompts, local=local) -> int:
                return counted(local.conn.generate(prompts[c, i], cfg.new_tokens, ignore_eos=True).size,
                               cfg.new_tokens, f"a triton {cfg.protocol} request")

            for _ in range(3):  # warm-up
                direct(0, 0)
            if clients > 1:
                batched(0)  # warm-up at this batch size
            def triton_round() -> Scenario:
                try:
                    return run_clients(clients, cfg.requests, served, f"triton {cfg.protocol}", setup=connect)
                finally:
                    for conn in opened:
                        conn.close()
                    opened.clear()

            paths = [lambda: run_clients(clients, cfg.requests, direct, "direct onnxruntime")]
            if clients > 1:  # the best one session can do with concurrent requests: batch them
                paths.append(lambda: run_batched(clients, cfg.requests, batched, "direct onnxruntime, batched"))
            paths.append(triton_round)
            rounds: dict[str, list[Scenario]] = {}
            done, total = 0, cfg.rounds * len(paths)
            progress(stage, done, total)
            for k in range(cfg.rounds):  # the order alternates, so no path always runs after the same one
                for run in (paths if k % 2 == 0 else paths[::-1]):
                    sc = run()
                    rounds.setdefault(sc.name, []).append(sc)
                    done += 1
                    progress(stage, done, total)
            results += [merge_rounds(r) for r in rounds.values()]
    return results


def _stream_request(url: str, prompt: np.ndarray, n: int) -> list[float]:
    """One HTTP generate_stream request for exactly `n` new tokens (ignore_eos, the count checked); the
    arrival time of each token (perf_counter)."""
    host, port = url.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=300)
    try:
        conn.request("POST", "/v2/models/wide_llm/generate_stream",
                     body=json.dumps({"input_ids": prompt.tolist(), "max_new_tokens": n, "ignore_eos": True}),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        times = []
        for line in resp:
            if line.startswith(b"data:"):
                if b'"error"' in line:
                    raise WideError(f"the server refused a benchmark request: {line[5:].decode().strip()}")
                times.append(time.perf_counter())
        counted(len(times), n, "a streamed request")
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


def _measure_staggered(cfg: ServingBenchConfig, onnx: Path, tmp: Path,
                       progress: Progress = _no_progress) -> list[Scenario]:
    from wide_export.tritonserver import generation_model as gm
    from wide_export.tritonserver.repository import RepoOptions, generate_repository
    from wide_export.tritonserver.server import TritonServer

    results = []
    for batching in ("static", "inflight"):
        stage = f"{cfg.staggered} staggered streaming requests, {batching} batching"
        progress(f"{stage}, writing its repository")
        repo = generate_repository(tmp / f"repo-{batching}", onnx=onnx,
                                   options=RepoOptions(streaming=True, batching=batching))
        settings = gm.Settings.load(str(repo / "wide_llm" / "1"))
        plan = staggered_plan(cfg, settings.vocab_size, settings.max_total_tokens)
        progress(f"{stage}, starting tritonserver")
        with TritonServer(repo, **cfg.server_ports()) as server:
            url = server.endpoints.http
            progress(f"{stage}, warm-up")
            for _ in range(2):  # warm-up
                _stream_request(url, plan[0][1], plan[0][2])
            latencies, firsts, errors = [0.0] * len(plan), [0.0] * len(plan), []
            finished, lock = [0], threading.Lock()
            progress(stage, 0, len(plan))
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
                with lock:
                    finished[0] += 1
                    progress(stage, finished[0], len(plan))

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


@dataclass
class StreamTiming:
    """One streamed request: when it was sent and when each chunk carrying tokens arrived (perf_counter s)."""

    sent: float
    token_times: list = field(default_factory=list)  # one entry per chunk that carried tokens
    tokens: int = 0  # completion tokens (the usage chunk's count)


def percentile(values, q: float) -> Optional[float]:
    """numpy's linear percentile, None for no values."""
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if len(values) else None


def openai_stats(name: str, clients: int, timings: list[StreamTiming], wall_s: float) -> dict:
    """Tokens/s over the scenario's wall time; p50/p99 of time to first token (sent -> first token chunk),
    of inter-token latency (gaps between consecutive token chunks of a request, all requests pooled) and of
    request latency (sent -> last token chunk), in ms."""
    def ms(value: Optional[float]) -> Optional[float]:
        return None if value is None else round(value, 3)

    ttft = [(t.token_times[0] - t.sent) * 1e3 for t in timings if t.token_times]
    itl = [(b - a) * 1e3 for t in timings for a, b in zip(t.token_times, t.token_times[1:])]
    latency = [(t.token_times[-1] - t.sent) * 1e3 for t in timings if t.token_times]
    tokens = sum(t.tokens for t in timings)
    return {"name": name, "clients": clients, "requests": len(timings), "tokens": tokens,
            "wall_s": round(wall_s, 6), "tokens_per_s": round(tokens / wall_s, 2) if wall_s > 0 else None,
            "ttft_p50_ms": ms(percentile(ttft, 50)), "ttft_p99_ms": ms(percentile(ttft, 99)),
            "itl_p50_ms": ms(percentile(itl, 50)), "itl_p99_ms": ms(percentile(itl, 99)),
            "p50_ms": ms(percentile(latency, 50)), "p99_ms": ms(percentile(latency, 99))}


def openai_stream(client, model: str, prompt: list, max_tokens: int, user: Optional[str] = None) -> StreamTiming:
    """One streaming /v1/completions request through the official client; ignore_eos so that it
    generates exactly max_tokens (checked against the usage chunk). `user`: the OpenAI field the API's fair
    scheduling tells clients apart by (each bench client its own, as separate users would be)."""
    timing = StreamTiming(sent=time.perf_counter())
    extra = {"user": user} if user is not None else {}
    stream = client.completions.create(
        model=model, prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True, **extra,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True, "return_token_ids": True})
    usage = None
    for chunk in stream:
        now = time.perf_counter()
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            ids = (choice.model_extra or {}).get("token_ids")
            if (len(ids) if ids is not None else int(bool(choice.text))) > 0:
                timing.token_times.append(now)
    if usage is None:
        raise WideError("the OpenAI frontend sent no usage chunk")
    timing.tokens = int(usage.completion_tokens)
    if timing.tokens != max_tokens:
        raise WideError(f"a streamed request got {timing.tokens} of {max_tokens} tokens (ignore_eos not honoured?)")
    return timing


def _openai_repository(cfg: ServingBenchConfig, tmp: Path, progress: Progress) -> Path:
    from wide_export.tritonserver.repository import RepoOptions, generate_repository

    if cfg.repository is not None:
        return cfg.repository
    onnx = cfg.onnx
    if onnx is None:
        progress("exporting the demo model")
        onnx = export_onnx_cli(tmp / "onnx")
    progress("writing a streaming Triton repository")
    return generate_repository(tmp / "repo-openai", onnx=onnx, options=RepoOptions(streaming=True))


def _measure_openai(cfg: ServingBenchConfig, repo: Path,
                    progress: Progress = _no_progress) -> tuple[list[dict], str]:
    """Per client count: C threads, each with its own openai client, `requests` streamed completions."""
    from openai import OpenAI

    from wide_export.serving.openai.runner import prepare_frontend
    from wide_export.tritonserver.server import TritonServer
    from wide_export.generation.settings import Settings

    frontend = prepare_frontend(repo, port=cfg.openai_port)
    model = frontend.models[0]
    try:
        vocab = int(Settings.load(str(model.folder)).vocab_size)
    except (OSError, TypeError, ValueError):
        frontend.stop()
        raise WideError(f"{model.folder} has no readable generation.json with vocab_size") from None
    decoupled = re.search(r"decoupled\s*:\s*true", (repo / model.triton_name / "config.pbtxt").read_text()) is not None
    rows = []
    try:
        progress("starting tritonserver and the OpenAI frontend")
        with TritonServer(repo, **cfg.server_ports()) as server:
            from wide_export.serving.triton_engine import TritonEngine

            frontend.start(TritonEngine(server.endpoints.grpc, frontend.served_names()))
            for clients in cfg.clients:
                stage = f"{clients} client{'s' if clients > 1 else ''}, OpenAI completions stream"
                progress(stage, 0, clients * cfg.requests)
                prompts = _prompts(cfg, vocab, clients)
                local, timings, lock = threading.local(), [], threading.Lock()

                def connect(c: int) -> None:
                    local.client = OpenAI(base_url=frontend.url, api_key="none", max_retries=0, timeout=600)
                    openai_stream(local.client, model.name, prompts[c, 0].tolist(), cfg.new_tokens,  # warm-up
                                  f"bench-client-{c}")

                def one(c: int, i: int) -> int:
                    timing = openai_stream(local.client, model.name, prompts[c, i].tolist(), cfg.new_tokens,
                                           f"bench-client-{c}")
                    with lock:
                        timings.append(timing)
                        progress(stage, len(timings), clients * cfg.requests)
                    return timing.tokens

                scenario = run_clients(clients, cfg.requests, one, "openai completions stream", setup=connect)
                rows.append(openai_stats(scenario.name, clients, timings, scenario.wall_s))
    finally:
        frontend.stop()
    return rows, model.name if decoupled else f"{model.name} (not streaming: one response per request)"


def _run_openai_bench(cfg: ServingBenchConfig, console) -> dict:
    from rich.table import Table

    from wide_export.base.progress import Steps

    with tempfile.TemporaryDirectory(prefix="wide-bench-openai-") as tmp, Steps("bench serving") as steps:
        repo = _openai_repository(cfg, Path(tmp), steps.update)
        rows, model = _measure_openai(cfg, repo, steps.update)
    table = Table(title=f"OpenAI /v1/completions, stream, model {model}: prompt {cfg.prompt_len} tokens, "
                        f"{cfg.new_tokens} new tokens (ignore_eos), {cfg.requests} requests per client")
    for col in ("clients", "tok/s", "TTFT p50 ms", "TTFT p99 ms", "ITL p50 ms", "ITL p99 ms", "p50 ms", "p99 ms"):
        table.add_column(col, justify="right")

    def fmt(value) -> str:
        return "-" if value is None else f"{value:.1f}"

    for r in rows:
        table.add_row(str(r["clients"]), fmt(r["tokens_per_s"]), fmt(r["ttft_p50_ms"]), fmt(r["ttft_p99_ms"]),
                      fmt(r["itl_p50_ms"]), fmt(r["itl_p99_ms"]), fmt(r["p50_ms"]), fmt(r["p99_ms"]))
    console.print(table)
    return {"config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()}, "openai": rows}


def add_ratios(rows: list[dict]) -> None:
    """tokens_per_s_vs_direct (the one-request-per-call direct row) and tokens_per_s_vs_best_direct (the
    faster of the direct rows, batched or not, of the same client count), in place."""
    direct = {r["clients"]: r["tokens_per_s"] for r in rows if r["name"] == "direct onnxruntime"}
    best: dict[int, float] = {}
    for r in rows:
        if r["name"].startswith("direct"):
            best[r["clients"]] = max(best.get(r["clients"], 0.0), r["tokens_per_s"])
    for r in rows:
        r["tokens_per_s_vs_direct"] = round(r["tokens_per_s"] / direct[r["clients"]], 3)
        r["tokens_per_s_vs_best_direct"] = round(r["tokens_per_s"] / best[r["clients"]], 3)


def run_serving_bench(cfg: ServingBenchConfig) -> dict:
    """Measure, print a table, write JSON to cfg.output; returns the results."""
    from rich.console import Console
    from rich.table import Table

    from wide_export.tritonserver.repository import generate_repository

    if cfg.protocol not in ("http", "grpc"):
        raise WideError(f"unknown protocol {cfg.protocol!r}", hint="http or grpc")
    if cfg.staggered < 0 or cfg.arrival_ms < 0:
        raise WideError("--staggered and --arrival-ms must be >= 0")
    if not cfg.clients or any(c < 1 for c in cfg.clients):
        raise WideError(f"--clients must be >= 1, got {list(cfg.clients)}")
    if min(cfg.requests, cfg.prompt_len, cfg.new_tokens, cfg.rounds) < 1:
        raise WideError("--requests, --prompt-len, --new-tokens and --rounds must be >= 1")
    if cfg.base_port is not None and not 1 <= cfg.base_port <= 65535 - 3:
        raise WideError(f"--base-port {cfg.base_port} leaves no room for its 4 ports",
                        "pass a port from 1 to 65532: the bench uses it and the next three")
    if cfg.repository is not None and not cfg.openai:
        raise WideError("--repository is for --openai", hint="add --openai, or give --onnx")
    console = Console(highlight=False)
    if cfg.openai:
        result = _run_openai_bench(cfg, console)
        cfg.output.parent.mkdir(parents=True, exist_ok=True)
        cfg.output.write_text(json.dumps(result, indent=2) + "\n")
        console.print(f"wrote {cfg.output}")
        return result
    from wide_export.base.progress import Steps

    # Progress on stderr: the stage and its count on a terminal, one line per stage when piped.
    with tempfile.TemporaryDirectory(prefix="wide-bench-serving-") as tmp, Steps("bench serving") as steps:
        onnx = cfg.onnx
        if onnx is None:
            steps.update("exporting the demo model")
            onnx = export_onnx_cli(Path(tmp) / "onnx")
        from wide_export.tritonserver import RepoOptions

        # The same ONNX Runtime threads on both paths (the direct session in this process, the server's
        # instance in its Python stub), so the table compares the same work with the same resources.
        steps.update("writing the Triton repository")
        repo = generate_repository(Path(tmp) / "repo", onnx=onnx,
                                   options=RepoOptions(intra_op_threads=direct_threads()))
        scenarios = _measure(cfg, repo, steps.update)
        staggered = []
        if cfg.staggered:
            staggered = _measure_staggered(cfg, onnx, Path(tmp), steps.update)
    rows = [s.summary() for s in scenarios]
    add_ratios(rows)
    table = Table(title=f"serving: prompt {cfg.prompt_len}, {cfg.new_tokens} new tokens, "
                        f"{cfg.requests} requests per client")
    for col in ("path", "clients", "tokens/s", "vs best direct", "p50 ms", "p99 ms"):
        table.add_column(col, justify="right" if col != "path" else "left")
    for r in rows:
        table.add_row(r["name"], str(r["clients"]), f"{r['tokens_per_s']:.1f}",
                      f"{r['tokens_per_s_vs_best_direct']:.2f}x", f"{r['p50_ms']:.1f}", f"{r['p99_ms']:.1f}")
    console.print(table)
    console.print(COMPARES, soft_wrap=True)
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
              "staggered": stag_rows, "compares": COMPARES, "intra_op_threads": direct_threads()}
    cfg.output.parent.mkdir(parents=True, exist_ok=True)
    cfg.output.write_text(json.dumps(result, indent=2) + "\n")
    console.print(f"wrote {cfg.output}")
    return result
