"""`wide-export triton` (model repository), `wide-export serve` (real tritonserver)
and `wide-export bench serving`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from wide_export.cli.common import model_folder_callback, user_errors


def _port_option(flag: str, what: str):
    return typer.Option(flag, help=f"{what} port (default: a free one).", show_default=False)


@user_errors
def triton(
    output: Annotated[Path, typer.Option("--output", "-o", help="Model repository folder to write (new or empty; "
                                         "an existing one needs --force).")],
    onnx: Annotated[Optional[Path], typer.Option(
        "--onnx", help="Folder from `wide-export onnx` (model.onnx + wide_config.json).", show_default=False)] = None,
    engines: Annotated[Optional[Path], typer.Option(
        "--engines", help="Folder from `wide-export trt` (engines + wide_engine.json).", show_default=False)] = None,
    backend: Annotated[Optional[str], typer.Option(
        "--backend", help="tensorrt or onnxruntime (default: from --engines / --onnx).", show_default=False)] = None,
    model_name: Annotated[str, typer.Option("--model-name", help="Name of the generation model.")] = "wide_llm",
    max_batch: Annotated[int, typer.Option("--max-batch", help="Most prompts batched into one generation.")] = 8,
    instances: Annotated[int, typer.Option(
        "--instances", help="Instances of the generation model (the tensorrt_plan model has one per GPU).")] = 1,
    streaming: Annotated[bool, typer.Option(
        "--streaming", help="Decoupled generation model: one response per new token "
                            "(HTTP generate_stream / gRPC stream).")] = False,
    batching: Annotated[Optional[str], typer.Option(
        "--batching", help="Streaming only: inflight (requests join the running batch at the next decode "
                           "step and leave when done; the default) or static (each batch runs start to end). "
                           "--batching inflight implies --streaming.", show_default=False)] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing --output folder (never one that is or "
                                                       "holds the --onnx/--engines folder).")] = False,
) -> None:
    """Write a Triton model repository (generation model + tensorrt_plan models for engines).

    The generation model (Python backend) runs prefill then decode steps with the
    KV cache: ONNX Runtime for --onnx, BLS calls to the engines for --engines.
    """
    from rich.console import Console

    from wide_export.tritonserver.repository import RepoOptions, generate_repository

    if batching == "inflight":
        streaming = True
    elif batching == "static" and not streaming:
        from wide_export.base.errors import WideError

        raise WideError("--batching static is for --streaming repositories",
                        hint="a non-streaming repository always batches statically (Triton's dynamic batcher)")
    options = RepoOptions(model_name=model_name, max_batch=max_batch, instances=instances, streaming=streaming,
                          batching=batching or "inflight")

    def write(target: Path) -> Path:
        return generate_repository(target, onnx=onnx, engines=engines, backend=backend, options=options)

    if not force and output.is_dir() and any(output.iterdir()):  # as `onnx`/`trt`: say how to replace it
        from wide_export.base.errors import WideError

        raise WideError(f"{output} exists and is not empty", hint="pass --force to replace it, or choose a new "
                        "--output folder")
    if force and output.exists():  # as `onnx --force`: the old folder goes once the new one is complete
        from wide_export.base.outdir import atomic_output_dir, check_output_dir

        check_output_dir(output, force=True, protect=(onnx, engines))
        with atomic_output_dir(output, force=True) as staging:
            write(staging)
        repo = output
    else:
        repo = write(output)
    console = Console(highlight=False)
    console.print(f"[green]wrote[/] Triton model repository {repo}")
    for path in sorted(repo.glob("*/config.pbtxt")):
        console.print(f"  model {path.parent.name}")
    console.print(f"serve it: wide-export serve --repository {repo}")
    if streaming:
        console.print(f"stream:   POST /v2/models/{model_name}/generate_stream "
                      '{"input_ids": [...], "max_new_tokens": N}')


@user_errors
def serve(
    repository: Annotated[Optional[Path], typer.Option(
        "--repository", help="Model repository (from `wide-export triton`): tritonserver runs it.",
        show_default=False)] = None,
    model: Annotated[Optional[Path], typer.Option(
        "--model", help="Instead of a repository: a WIDE checkpoint folder served on CPU by the compiled CPU kernels "
                        "(`wide-export generate`'s path), OpenAI API only (--openai-port), no tritonserver.",
        show_default=False, callback=model_folder_callback)] = None,
    dtype: Annotated[str, typer.Option("--dtype", help="With --model: float32, bfloat16 or float16 weights.")]
    = "float32",
    threads: Annotated[Optional[int], typer.Option("--threads", help="With --model: CPU threads (default: "
                                                                     "torch's).", show_default=False)] = None,
    http_port: Annotated[Optional[int], typer.Option(
        "--http-port", help="Triton's HTTP port (default: a free one; with --openai-port, Triton's HTTP endpoint is "
                            "off unless this is given).", show_default=False)] = None,
    grpc_port: Annotated[Optional[int], _port_option("--grpc-port", "gRPC")] = None,
    metrics_port: Annotated[Optional[int], typer.Option(
        "--metrics-port", help="Serve Prometheus metrics on this port (default: metrics off).",
        show_default=False)] = None,
    address: Annotated[str, typer.Option("--address", help="Address to bind (loopback by default).")] = "127.0.0.1",
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds to wait for the models to load.")] = 300.0,
    log_verbose: Annotated[int, typer.Option("--log-verbose", help="tritonserver --log-verbose level.")] = 0,
    openai_port: Annotated[Optional[int], typer.Option(
        "--openai-port", help="Also serve an OpenAI-compatible API (/v1/completions, /v1/chat/completions, "
                              "/v1/models, /health) on this port, in front of tritonserver.",
        show_default=False)] = None,
    openai_address: Annotated[str, typer.Option(
        "--openai-address", help="Address the OpenAI API binds (loopback by default).")] = "127.0.0.1",
    served_model_name: Annotated[Optional[str], typer.Option(
        "--served-model-name", help="The `model` name OpenAI clients use (default: the generation model's name; "
                                    "the repository must hold exactly one).", show_default=False)] = None,
    max_connections: Annotated[Optional[int], typer.Option(
        "--max-connections", help="OpenAI API: open connections allowed; one more gets a 503 at once (default: "
                                  "4096, or the descriptor limit minus 96 when lower).", show_default=False)] = None,
    max_body_bytes: Annotated[Optional[int], typer.Option(
        "--max-body-bytes", help="OpenAI API: largest request body; a larger one is a 413 before it is parsed "
                                 "(default: 2 MiB).", show_default=False)] = None,
    max_tokens: Annotated[Optional[int], typer.Option(
        "--max-tokens", help="OpenAI API: most tokens one request may generate; above it a 400, and a chat that "
                             "asks for none gets this many (default: no cap but the context).",
        show_default=False)] = None,
    max_running_per_client: Annotated[Optional[int], typer.Option(
        "--max-running-per-client", help="OpenAI API: requests one client (local user, then `user` field) runs "
                                         "at once per model (default: the model's batch size minus one, so "
                                         "another client always finds a free row).", show_default=False)] = None,
    max_waiting: Annotated[Optional[int], typer.Option(
        "--max-waiting", help="OpenAI API: requests waiting per model, at most half of them one client's; "
                              "one more is a 503 (a 429 for that client) at once (default: 256).",
        show_default=False)] = None,
    api_key: Annotated[Optional[str], typer.Option(
        "--api-key", help="OpenAI API: every route but /health needs the header `Authorization: Bearer KEY` "
                          "(else a 401). Default: the WIDE_API_KEY environment variable, which other local users "
                          "cannot read in the process list as they can this flag; neither: no key.",
        show_default=False)] = None,
) -> None:
    """Start a real tritonserver on the repository, wait until ready, stop on Ctrl-C; or, with --model, the
    OpenAI API alone on the CPU generation path (no tritonserver).

    With --openai-port, an OpenAI-compatible HTTP API runs in front of it (talking to it over gRPC) and
    Triton's own HTTP endpoint is off unless --http-port asks for it. A tritonserver that dies, or whose
    model process dies or hangs, is restarted (at most 5 times in 10 minutes).

    Exit codes, as every command's: 130 Ctrl-C (SIGINT), 143 SIGTERM, once the server is stopped, also after
    it was ready; 2 bad input or a server that cannot start or keeps dying.
    """
    from rich.console import Console

    from wide_export.base.signals import interrupt_on_signals

    console = Console(highlight=False)
    if (repository is None) == (model is None):
        from wide_export.base.errors import WideError

        raise WideError("serve runs a Triton repository (--repository) or a checkpoint on CPU (--model)",
                        hint="give exactly one of them")
    if model is None and (dtype != "float32" or threads is not None):
        from wide_export.base.errors import WideError

        flag = "--dtype" if dtype != "float32" else "--threads"
        raise WideError(f"{flag} is for --model (the CPU path); a repository's models carry their own",
                        hint="drop " + flag)
    if model is not None:
        return _serve_cpu(console, model, dtype, threads, openai_port, openai_address, served_model_name,
                          {"--http-port": http_port, "--grpc-port": grpc_port, "--metrics-port": metrics_port,
                           "--address": None if address == "127.0.0.1" else address,
                           "--log-verbose": log_verbose or None},
                          frontend_limits(max_connections, max_body_bytes),
                          request_policy(max_tokens, max_running_per_client, max_waiting), api_key)
    openai_only = {"--served-model-name": served_model_name, "--max-connections": max_connections,
                   "--max-body-bytes": max_body_bytes, "--max-tokens": max_tokens,
                   "--max-running-per-client": max_running_per_client, "--max-waiting": max_waiting,
                   "--api-key": api_key}
    given = [flag for flag, value in openai_only.items() if value is not None]
    if openai_port is None and given:
        from wide_export.base.errors import WideError

        raise WideError(f"{given[0]} is for the OpenAI API", hint="add --openai-port PORT")
    from wide_export.serving.triton_server import ServeOptions, start_serving

    opts = ServeOptions(repository, http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port,
                        address=address, timeout=timeout, log_verbose=log_verbose, openai_port=openai_port,
                        openai_address=openai_address, served_model_name=served_model_name)
    if openai_port is not None:
        opts.limits = frontend_limits(max_connections, max_body_bytes)
        opts.policy = request_policy(max_tokens, max_running_per_client, max_waiting)
        from wide_export.base.api_key import api_key_from

        opts.api_key = api_key_from(api_key)
    with interrupt_on_signals():  # SIGTERM while loading stops the server as Ctrl-C does (its own session)
        serving = start_serving(opts, stage=lambda message: console.status(message))
    server, frontend = serving.server, serving.frontend
    ends = serving.endpoints
    _warn_exposed(frontend, address)
    console.print(f"[green]ready[/]  HTTP {ends.http if server.http else 'off'}  gRPC {ends.grpc}"
                  + (f"  metrics {ends.metrics}" if ends.metrics else "")
                  + (f"  OpenAI {frontend.url}" if frontend is not None else ""), soft_wrap=True)
    if frontend is not None:
        console.print(f"models: {', '.join(m.name for m in frontend.models)}", markup=False)
    console.print("Ctrl-C to stop")
    signum = serving.wait(report=lambda line: console.print(line, markup=False))
    import signal as signals

    console.print(f"stopped ({signals.Signals(signum).name}); tritonserver and its models are down")
    raise typer.Exit(128 + signum)  # 130 Ctrl-C, 143 SIGTERM: the rule of every command (README)


def _serve_cpu(console, model: Path, dtype: str, threads: Optional[int], openai_port: Optional[int],
               openai_address: str, served_model_name: Optional[str], triton_flags: dict, limits, policy,
               api_key: Optional[str]) -> None:
    """serve --model: the OpenAI API on the CPU generation path until SIGINT / SIGTERM."""
    import signal as signals

    from wide_export.serving.cpu_server import prepare, serve_until_signal
    from wide_export.base.errors import WideError
    from wide_export.base.signals import interrupt_on_signals

    given = [flag for flag, value in triton_flags.items() if value is not None]
    if given:
        raise WideError(f"{given[0]} is tritonserver's, and --model serves without it", hint="drop " + given[0])
    if openai_port is None:
        raise WideError("--model serves the OpenAI API only", hint="add --openai-port PORT")
    from wide_export.base.api_key import api_key_from

    api_key = api_key_from(api_key)
    with interrupt_on_signals():
        with console.status(f"loading {model} for the CPU kernels ..."):
            frontend, gen = prepare(model, openai_address, openai_port, served_model_name, dtype=dtype,
                                    threads=threads, limits=limits, policy=policy, api_key=api_key)
        try:
            with console.status("starting the OpenAI API ..."):
                frontend.start()
        except BaseException:
            frontend.stop()
            raise
    kernels = f"CPU kernels {gen.kernels}" if gen.kernels else "no CPU kernels (dense path)"
    _warn_exposed(frontend, None)
    console.print(f"[green]ready[/]  OpenAI {frontend.url}  ({kernels}, {dtype})", soft_wrap=True)
    console.print(f"models: {', '.join(m.name for m in frontend.models)}", markup=False)
    console.print("Ctrl-C to stop")
    signum = serve_until_signal(frontend)
    console.print(f"stopped ({signals.Signals(signum).name})")
    raise typer.Exit(128 + signum)


def _warn_exposed(frontend, triton_address: Optional[str]) -> None:
    """One warning line on stderr for each API listening beyond loopback without a key: the OpenAI API without
    --api-key, tritonserver's own endpoints (which take none) on a non-loopback --address."""
    import sys

    from wide_export.base.api_key import exposure_warning, is_loopback

    lines = []
    if frontend is not None:
        lines.append(exposure_warning(frontend.host, frontend.api_key))
    if triton_address is not None and not is_loopback(triton_address):
        lines.append(f"warning: tritonserver's endpoints listen on {triton_address} and take no API key: anyone "
                     "who reaches them can use the models (leave --address on 127.0.0.1 and serve others through "
                     "--openai-port with --api-key)")
    for line in lines:
        if line:
            print(line, file=sys.stderr, flush=True)


def frontend_limits(max_connections: Optional[int], max_body_bytes: Optional[int]):
    """The OpenAI frontend's limits from serve's flags (WideError for one that cannot work)."""
    from wide_export.base.errors import WideError
    from wide_export.serving.openai.limits import Limits

    if max_connections is not None and max_connections < 1:
        raise WideError(f"--max-connections {max_connections} must be at least 1",
                        hint="omit it for the default (4096, or the descriptor limit minus 96)")
    if max_body_bytes is None:
        return Limits.for_this_process(max_connections)
    if max_body_bytes < 1024:
        raise WideError(f"--max-body-bytes {max_body_bytes} is too small for any request", hint="use 1024 or more")
    return Limits.for_this_process(max_connections, max_body_bytes=max_body_bytes)


def request_policy(max_tokens: Optional[int], per_client: Optional[int], max_waiting: Optional[int]):
    """The OpenAI frontend's request policy from serve's flags (WideError for a value below 1, or 0 waiting)."""
    from wide_export.base.errors import WideError
    from wide_export.serving.openai.admission import RequestPolicy

    for flag, value, least in (("--max-tokens", max_tokens, 1), ("--max-running-per-client", per_client, 1),
                               ("--max-waiting", max_waiting, 0)):
        if value is not None and value < least:
            raise WideError(f"{flag} {value} must be at least {least}", hint=f"omit {flag} for the default")
    return RequestPolicy(max_tokens=max_tokens, per_client=per_client,
                         max_waiting=256 if max_waiting is None else max_waiting)


def bench_serving(
    onnx: Annotated[Optional[Path], typer.Option(
        "--onnx", help="ONNX folder to serve (default: export the demo model into a temp folder).",
        show_default=False)] = None,
    requests: Annotated[int, typer.Option("--requests", help="Requests per client.")] = 8,
    prompt_len: Annotated[int, typer.Option("--prompt-len", help="Prompt tokens per request.")] = 16,
    new_tokens: Annotated[int, typer.Option("--new-tokens", help="Tokens generated per request.")] = 16,
    protocol: Annotated[str, typer.Option("--protocol", help="http or grpc.")] = "grpc",
    seed: Annotated[int, typer.Option("--seed", help="Seed for the random prompts.")] = 0,
    output: Annotated[Path, typer.Option("--output", help="Where to write the JSON results.")] = Path(
        "bench-results/serving.json"),
    staggered: Annotated[int, typer.Option(
        "--staggered", help="Streaming requests arriving staggered, served with static and with in-flight "
                            "batching (0 skips this part).")] = 16,
    arrival_ms: Annotated[float, typer.Option("--arrival-ms", help="Mean gap between staggered arrivals.")] = 10.0,
    clients: Annotated[Optional[list[int]], typer.Option(
        "--clients", help="Concurrent clients, one scenario each (repeat the option; default: 1 and 8).",
        show_default=False)] = None,
    rounds: Annotated[int, typer.Option(
        "--rounds", help="Interleaved rounds of the direct, batched and served paths per client count "
                         "(pooled; each round's tokens/s is in the JSON).")] = 3,
    openai: Annotated[bool, typer.Option(
        "--openai", help="Measure the OpenAI-compatible API instead: streaming /v1/completions through the "
                         "official openai client (TTFT, inter-token latency, tokens/s).")] = False,
    repository: Annotated[Optional[Path], typer.Option(
        "--repository", help="--openai: serve this repository (default: a streaming one from --onnx or the demo "
                             "model).", show_default=False)] = None,
    base_port: Annotated[Optional[int], typer.Option(
        "--base-port", help="Ports to use, all on 127.0.0.1: tritonserver's HTTP, gRPC and metrics on BASE, "
                            "BASE+1, BASE+2, the OpenAI API (--openai) on BASE+3. Default: free ports the system "
                            "picks.", show_default=False)] = None,
) -> None:
    """Tokens/s and p50/p99 latency of the served onnxruntime flavour, 1 and 8 clients,
    next to direct ONNX Runtime calls in the same run; then staggered streaming requests,
    static vs in-flight batching. With --openai: time to first token, inter-token latency
    and tokens/s of streaming /v1/completions through the OpenAI-compatible API."""
    from wide_export.bench.serving import CLIENT_COUNTS, ServingBenchConfig, run_serving_bench

    run_serving_bench(ServingBenchConfig(
        onnx=onnx, requests=requests, prompt_len=prompt_len, new_tokens=new_tokens, protocol=protocol,
        seed=seed, output=output, staggered=staggered, arrival_ms=arrival_ms, rounds=rounds,
        clients=tuple(clients) if clients else CLIENT_COUNTS, openai=openai, repository=repository,
        base_port=base_port,
    ))


def register(app: typer.Typer) -> None:
    """Add `triton`, `serve` and `bench serving`."""
    app.command("triton", no_args_is_help=True)(triton)
    app.command("serve", no_args_is_help=True)(serve)
    from wide_export.cli.bench_cmd import bench_app

    bench_app.command("serving")(user_errors(bench_serving))
