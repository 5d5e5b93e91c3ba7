"""The engine build as Polygraphy's loader chain:

    NetworkFromOnnxPath(path, strongly_typed=True)
      -> CreateConfig / CreateConfigRTX(profiles=[Profile...], load_timing_cache=..., progress_monitor=...)
      -> EngineBytesFromNetwork(network, config, save_timing_cache=...)

Polygraphy supports both flavours: it imports `tensorrt_rtx` instead of
`tensorrt` when `polygraphy.config.USE_TENSORRT_RTX` is set (env
POLYGRAPHY_USE_TENSORRT_RTX=1), decided once, when its TensorRT backend is first
imported; `use_flavour` makes that choice match ours before anything imports it.
What is still ours, and why:
  * the TensorRT logger: Polygraphy's forwards every parser warning, and an
    inlined `wide` function body repeats node names hundreds of times; ours
    drops that message and the Int64-binding reminder (_NOISE says why; set as
    Polygraphy's global TRT_LOGGER, so its loaders use it);
  * the compute capability names (`SM89`): CreateConfigRTX takes (major, minor)
    pairs, converted here, with our error for an unknown name;
  * the timing cache goes through a private temp file (Polygraphy's file-like
    support needs a real file), so the caller writes it atomically with the engine;
  * `SaveEngine` is not used: it writes one file in place, while the engine,
    manifest and cache are written together into a temp folder renamed at the
    end (wide_export/base/outdir.py).
"""

from __future__ import annotations

import os
import sys
from typing import Any, Optional

from wide_export.base.errors import WideError
from wide_export.base.signals import check_interrupted, interrupted

# Parser warnings that say nothing to the user, each dropped for its reason:
_NOISE = (
    # it names inlined function-body nodes after their outputs, which repeat in every instance of a `wide`
    # op, and warns once per node
    "already exists, the output tensors of this new instance will not be queryable",
    # "Make sure input input_ids has Int64 binding", once per int64 input on every build: TensorRT 10+ keeps
    # int64 inputs int64 (no cast to int32 as TensorRT 8 did) and reminds the caller to bind int64 buffers;
    # every runner of ours binds input_ids / attention_mask / position_ids as int64 (Polygraphy's TrtRunner
    # with the graph's int64 arrays, Triton's TYPE_INT64), and no declaration of the input silences it
    "has Int64 binding",
)


def use_flavour(be) -> None:
    """Make Polygraphy import the same TensorRT module as `be` (tensorrt or tensorrt_rtx)."""
    os.environ["POLYGRAPHY_USE_TENSORRT_RTX"] = "1" if be.is_rtx else "0"
    from polygraphy import config

    if "polygraphy.backend.trt" in sys.modules and config.USE_TENSORRT_RTX != be.is_rtx:
        raise WideError(f"Polygraphy already uses the other TensorRT flavour in this process, not {be.flavour}",
                        hint="use one --backend per process")
    config.USE_TENSORRT_RTX = be.is_rtx
    import polygraphy.backend.trt.util as trt_util
    from polygraphy.logger import G_LOGGER

    trt_util.TRT_LOGGER = quiet_logger(be.trt)
    G_LOGGER.module_severity = G_LOGGER.WARNING  # not its INFO dump of the whole build configuration


def chain_record(be) -> dict[str, Any]:
    """What built the engine, for the manifest: Polygraphy's version and its loaders, in order."""
    import polygraphy

    config = "CreateConfigRTX" if be.is_rtx else "CreateConfig"
    return {"polygraphy": polygraphy.__version__, "loaders": ["NetworkFromOnnxPath", config, "EngineBytesFromNetwork"]}


def quiet_logger(trt):
    """A WARNING-level TensorRT logger that drops the parser warnings of _NOISE."""

    class Logger(trt.ILogger):
        def __init__(self):
            trt.ILogger.__init__(self)

        def log(self, severity, msg):
            if interrupted():  # a cancelled build's "[E] ... BuildCanceled" lines would bury our one line
                return
            if severity <= trt.ILogger.Severity.WARNING and not any(noise in msg for noise in _NOISE):
                print(f"[TRT] [{str(severity).rsplit('.', 1)[-1][0]}] {msg}", file=sys.stderr)

    return Logger()


def parse_network(be, onnx_file: str):
    """(builder, network, parser) of a strongly typed network; keep the parser alive until the build."""
    from polygraphy.backend.trt import NetworkFromOnnxPath
    from polygraphy.exception import PolygraphyException

    try:
        return NetworkFromOnnxPath(onnx_file, strongly_typed=True)()
    except PolygraphyException as err:
        raise WideError(f"{be.flavour} could not parse {onnx_file}: {err} (parser errors above)",
                        hint="a `wide` node without a registered plugin needs its function body in the model") from None


# TensorRT-RTX without a GPU cannot query one: build for this compute capability.
RTX_DEFAULT_CC = "SM89"


def rtx_target(be, requested: Optional[str]) -> Optional[str]:
    """The TensorRT-RTX compute capability to build for (checked), or None for datacenter TensorRT."""
    from wide_export.trt.backend import has_gpu

    if not be.is_rtx:
        return None
    cc = requested or ("CURRENT" if has_gpu() else RTX_DEFAULT_CC)
    if cc != "CURRENT":
        compute_capability_pair(be.trt, cc)
    return cc


def compute_capability_pair(trt, name: str) -> tuple[int, int]:
    """'SM89' -> (8, 9), 'SM120' -> (12, 0), after checking TensorRT-RTX knows the name."""
    members = [m for m in trt.ComputeCapability.__members__ if m.startswith("SM")]
    if name not in members:
        raise WideError(f"unknown compute capability {name!r}", hint="one of CURRENT, " + ", ".join(members))
    digits = name[2:]
    return int(digits[:-1]), int(digits[-1])


def create_config(be, profiles: list[Any], cache_file: Optional[str], compute_capability: Optional[str],
                  monitor=None):
    """Polygraphy's CreateConfig (CreateConfigRTX for TensorRT-RTX) with our profiles and timing cache."""
    from polygraphy.backend.trt import CreateConfig, Profile

    pg_profiles = []
    for prof in profiles:
        p = Profile()
        for name, (lo, opt, hi) in prof.shapes.items():
            p.add(name, lo, opt, hi)
        pg_profiles.append(p)
    kwargs = {"profiles": pg_profiles, "load_timing_cache": cache_file, "progress_monitor": monitor}
    if not be.is_rtx:
        return CreateConfig(**kwargs)
    from polygraphy.backend.tensorrt_rtx import CreateConfigRTX

    if compute_capability == "CURRENT":
        return CreateConfigRTX(use_gpu=True, **kwargs)
    return CreateConfigRTX(compute_capabilities=[compute_capability_pair(be.trt, compute_capability)], **kwargs)


def build_bytes(be, network, config, cache_file: str) -> bytes:
    """The serialized engine from EngineBytesFromNetwork, which also updates `cache_file`."""
    from polygraphy.backend.trt import EngineBytesFromNetwork
    from polygraphy.exception import PolygraphyException

    try:
        return bytes(EngineBytesFromNetwork(network, config=config, save_timing_cache=cache_file)())
    except PolygraphyException as err:
        check_interrupted()  # a cancelled build (Ctrl-C / SIGTERM via the progress monitor) is not an error
        raise WideError(f"{be.flavour} failed to build the engine: {err}", hint="see the TensorRT errors above") from None
