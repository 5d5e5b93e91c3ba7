"""Build the prefill + decode engine from an exported ONNX folder and write its manifest.

Output folder (plugins/trt/README.md):
  wide.engine             one engine, profile 0 = prefill, profile 1 = decode
  wide_engine.json        manifest (flavour, version, plugin library + sha256,
                          profiles, I/O names/dtypes/shapes, plugin-layer report)
  wide_config.json        copied from the ONNX folder
  libwide_trt_plugins.so  copy of the plugin library the engine was built with
  tokenizer.json, ...     the ONNX folder's tokenizer files, generation_config.json, genai_config.json
  timing.cache            TensorRT timing cache (reused by the next build)
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

from wide_export.base.errors import WideError
from wide_export.base.names import ENGINE_FILE, ONNX_FILE, TIMING_CACHE, WIDE_CONFIG
from wide_export.base.names import ENGINE_MANIFEST as MANIFEST
from wide_export.ops.spec import OPS
from wide_export.base.outdir import atomic_output_dir, check_output_dir
from wide_export.base.signals import check_interrupted, interrupt_on_signals
from wide_export.trt.backend import needs_child, rtx_child_env, select_backend
from wide_export.trt.plugins import PLUGIN_LIB_NAME, PluginLibrary, load_plugin_library
from wide_export.trt.profiles import build_profiles
from wide_export.trt.recipes import ProfileLimits, Recipe, check_group_sizes, load_recipe
from wide_export.trt.report import PluginReport, plugin_layer_names, plugin_report, wide_nodes

MANIFEST_FORMAT = "wide-engine/1"

_ONNX_DTYPES = {1: "float32", 10: "float16", 16: "bfloat16"}


def trt_dtype_name(trt, dtype) -> str:
    """'float16', 'int64', ... for a trt.DataType."""
    names = {"FLOAT": "float32", "HALF": "float16", "BF16": "bfloat16", "INT64": "int64", "INT32": "int32",
             "INT8": "int8", "UINT8": "uint8", "BOOL": "bool", "FP8": "float8"}
    for attr, name in names.items():
        if hasattr(trt.DataType, attr) and dtype == getattr(trt.DataType, attr):
            return name
    return str(dtype).split(".")[-1].lower()


def _no_onnx(onnx_dir: Path) -> WideError:
    """--onnx without model.onnx: what the folder is, if it is another of ours, else how to make one."""
    from wide_export.base.folders import elsewhere

    return WideError(f"{onnx_dir / ONNX_FILE} not found",
                     hint=elsewhere(onnx_dir, "onnx", {"engines": "it is built already; serve it with "
                                                                 "`wide-export triton --engines DIR`"})
                     or "export first: wide-export onnx --output DIR")


def _read_onnx_folder(onnx_dir: Path):
    """(onnx ModelProto without weights, wide_config dict or {}); model.onnx, its external-data
    locations and wide_config.json must lie inside onnx_dir (checked before TensorRT opens any)."""
    from wide_export.base.paths import confined, external_data_files, load_graph, read_json

    path = onnx_dir / ONNX_FILE
    if not path.is_file():
        raise _no_onnx(onnx_dir)
    confined(path, onnx_dir, "model file")
    model = load_graph(path)
    external_data_files(model, path)
    cfg_path = onnx_dir / WIDE_CONFIG
    config = {}
    if cfg_path.is_file():
        confined(cfg_path, onnx_dir, "model description")
        config = read_json(cfg_path, hint="export the folder again")
        if not isinstance(config, dict):
            raise WideError(f"{cfg_path}: expected a JSON object", hint="export the folder again")
    return model, config


def _graph_precision(model, config: dict[str, Any]) -> str:
    dtype = str(config.get("dtype", "")).lower().replace("torch.", "")
    if dtype in ("float16", "float32", "bfloat16"):
        return dtype
    for value in model.graph.input:  # the KV cache has the graph's dtype (logits are float32 in every export)
        if value.name.startswith("past_key_values."):
            return _ONNX_DTYPES.get(value.type.tensor_type.elem_type, "float32")
    return "float32"


def _tensors(trt, network, inputs: bool) -> list[dict[str, Any]]:
    count = network.num_inputs if inputs else network.num_outputs
    get = network.get_input if inputs else network.get_output
    return [{"name": t.name, "dtype": trt_dtype_name(trt, t.dtype), "shape": [int(d) for d in t.shape]}
            for t in (get(i) for i in range(count))]


def mask_names(config: dict[str, Any]) -> list[str]:
    """Router mask tensor names recorded in wide_config.json (`layers[i].attention|ffn.mask`)."""
    return [layer[kind]["mask"] for layer in config.get("layers") or []
            for kind in ("attention", "ffn") if layer.get(kind) and layer[kind].get("mask")]


def _mark_mask_outputs(network, config: dict[str, Any]) -> list[str]:
    """Make the router masks extra engine outputs (for decision agreement in verify_engine)."""
    wanted = set(mask_names(config))
    if not wanted:
        raise WideError("--mask-outputs needs the router mask names of wide_config.json (`layers`)")
    found = {}
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        for j in range(layer.num_outputs):
            tensor = layer.get_output(j)
            if tensor.name in wanted:
                found[tensor.name] = tensor
    missing = wanted - set(found)
    if missing:
        raise WideError(f"router masks not found in the parsed network: {sorted(missing)[:3]}")
    for name in sorted(found):
        network.mark_output(found[name])
    return sorted(found)


def check_engine_output(onnx_dir: Path, output_dir: Path, force: bool = False) -> Path:
    """Refuse an OUT that is / holds the ONNX folder, or that exists (unless `force`) and is not a
    previous engine folder (one with wide_engine.json: a rebuild replaces it, reusing its timing cache).
    An OUT inside the ONNX folder is refused too: the engines would land among the export's files."""
    onnx_abs, out_abs = Path(onnx_dir).resolve(), Path(output_dir).absolute().resolve()
    if onnx_abs in out_abs.parents:
        raise WideError(f"--output {output_dir} is inside the ONNX folder {onnx_dir}",
                        "choose an --output outside it, e.g. beside it")
    return check_output_dir(Path(output_dir), force=force or (Path(output_dir) / MANIFEST).is_file(),
                            protect=(Path(onnx_dir),))


def _write_outputs(output_dir: Path, files: dict[str, bytes], copies: dict[str, tuple[Path, Optional[Path]]],
                   force: bool) -> None:
    """Write everything into a sibling temp folder, then rename it to OUT (nothing half-written). `copies`:
    name -> (source, the user's folder it must lie in, or None for our own build's files)."""
    from wide_export.base.paths import copy_confined

    with atomic_output_dir(output_dir, force=force or (output_dir / MANIFEST).is_file()) as staging:
        for name, data in files.items():
            (staging / name).write_bytes(data)
        for name, (src, folder) in copies.items():
            if folder is None:
                shutil.copyfile(src, staging / name)
            else:  # a file of the user's export: copied from the descriptor that was checked (no race)
                copy_confined(src, staging / name, folder, "export file")


def _check_plugin_layers(model, network, trt, lib: Optional[PluginLibrary], required: bool) -> PluginReport:
    """Which `wide` nodes became plugin layers; with a library loaded (and `required`) all of them must."""
    report = plugin_report(wide_nodes(model.graph), plugin_layer_names(network, trt))
    missing = [n for n in report.inlined  # an op without a plugin (OpSpec.plugin) is inlined by design
               if (spec := OPS.get(n.op_type)) is None or spec.plugin]
    if lib is not None and required and missing:
        names = ", ".join(n.name for n in missing[:3])
        raise WideError(f"{len(missing)} wide node(s) were inlined although {lib.path.name} is loaded: {names}",
                        hint="the library lacks a creator for their op_type/version/namespace")
    return report


def build_engine_here(
    onnx_dir: str,
    output_dir: str,
    fp16: bool = False,
    plugins: Optional[str] = None,
    limits: Optional[dict[str, int]] = None,
    bf16: bool = False,
    recipe: Optional[str] = None,
    backend: Optional[str] = None,
    timing_cache: Optional[str] = None,
    compute_capability: Optional[str] = None,
    require_plugin_layers: bool = True,
    mask_outputs: bool = False,
    progress: bool = True,
    force: bool = False,
) -> dict[str, Any]:
    """build_engine's work, in this process (its environment must already suit the backend)."""
    started = time.perf_counter()
    onnx_path, out = Path(onnx_dir), Path(output_dir)
    check_engine_output(onnx_path, out, force)
    model, config = _read_onnx_folder(onnx_path)
    rec: Optional[Recipe] = load_recipe(recipe) if recipe else None
    base = rec.limits if rec else ProfileLimits()
    lim = base.override(**(limits or {})).checked(config.get("max_position_embeddings"))
    if rec:
        check_group_sizes(rec, config, str(onnx_path / WIDE_CONFIG))
    precision = _graph_precision(model, config)
    if fp16 and bf16:
        raise WideError("--fp16 and --bf16 exclude each other", hint="pass one of them")
    for flag, want in (("--fp16", "float16"), ("--bf16", "bfloat16")):
        if (fp16 if want == "float16" else bf16) and precision not in (want, "float32"):
            raise WideError(f"{flag} needs a {want} or float32 graph, but {onnx_path / ONNX_FILE} is {precision}",
                            hint=f"export it with `wide-export onnx --dtype {want}` (or float32)")
        if (fp16 if want == "float16" else bf16) and precision == want:
            print(f"note: {flag}: {onnx_path / ONNX_FILE} is already {want}, nothing to convert; building it as "
                  "it is", file=sys.stderr)
    with contextlib.ExitStack() as stack:
        graph_dir = onnx_path
        if (fp16 or bf16) and precision == "float32":  # strongly typed: the graph itself must be fp16 / bf16
            precision = "float16" if fp16 else "bfloat16"
            graph_dir, model, config = _fp16_graph(onnx_path, out, stack, precision)
        return _build(onnx_path, graph_dir, out, model, config, rec, lim, precision, started, plugins=plugins,
                      backend=backend, timing_cache=timing_cache, compute_capability=compute_capability,
                      require_plugin_layers=require_plugin_layers, mask_outputs=mask_outputs, progress=progress,
                      force=force)


def _fp16_graph(onnx_path: Path, out: Path, stack: contextlib.ExitStack, dtype: str = "float16"):
    """Convert the float32 export to fp16 / bf16 in a temp folder (removed with `stack`): (folder, model, config)."""
    from wide_export.export.fp16 import clamp_note, convert_export

    parent = next((p for p in (out.parent, *out.parent.parents) if p.is_dir()), None)
    tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=f".{out.name}.fp16-", dir=parent)))
    print(f"converting {onnx_path / ONNX_FILE} to {dtype} (onnxconverter-common)", file=sys.stderr)
    config = convert_export(onnx_path, tmp, dtype)
    note = clamp_note(config)
    if note:
        print(note, file=sys.stderr)
    model, _ = _read_onnx_folder(tmp)
    return tmp, model, config


def _build(onnx_path: Path, graph_dir: Path, out: Path, model, config: dict[str, Any], rec: Optional[Recipe],
           lim: ProfileLimits, precision: str, started: float, *, plugins: Optional[str], backend: Optional[str],
           timing_cache: Optional[str], compute_capability: Optional[str], require_plugin_layers: bool,
           mask_outputs: bool, progress: bool, force: bool) -> dict[str, Any]:
    """Parse graph_dir/model.onnx, build, and write OUT (onnx_path: the user's folder, for the manifest)."""
    be = select_backend(backend)
    trt = be.trt
    lib: Optional[PluginLibrary] = load_plugin_library(be, Path(plugins)) if plugins else None

    from wide_export.trt import loaders  # Polygraphy's loader chain (loaders.py says what stays ours)
    from wide_export.trt.progress import progress_monitor

    cc = loaders.rtx_target(be, compute_capability)  # a bad name fails before the parse
    loaders.use_flavour(be)
    builder, network, parser = loaders.parse_network(be, str(graph_dir / ONNX_FILE))
    report = _check_plugin_layers(model, network, trt, lib, require_plugin_layers)
    masks = _mark_mask_outputs(network, config) if mask_outputs else []
    inputs = [(t["name"], t["shape"]) for t in _tensors(trt, network, inputs=True)]
    profiles = build_profiles(inputs, lim)
    cache_path = Path(timing_cache) if timing_cache else out / TIMING_CACHE
    cache_bytes = cache_path.read_bytes() if cache_path.is_file() else b""
    with progress_monitor(trt, enabled=progress) as monitor, tempfile.TemporaryDirectory(prefix="wide-cache-") as tmp:
        cache_file = Path(tmp) / TIMING_CACHE
        cache_file.write_bytes(cache_bytes)
        create_config = loaders.create_config(be, profiles, str(cache_file) if cache_bytes else None, cc, monitor)
        engine = loaders.build_bytes(be, (builder, network, parser), create_config, str(cache_file))
        cache = cache_file.read_bytes()
    check_interrupted()  # a Ctrl-C/SIGTERM during the build is swallowed by TensorRT's callbacks

    manifest: dict[str, Any] = {
        "format": MANIFEST_FORMAT,
        "tensorrt": {"package": be.package, "flavour": be.flavour, "version": be.version},
        "compute_capability": cc,
        "precision": precision,
        "strongly_typed": True,  # NetworkFromOnnxPath(strongly_typed=True) fails where unsupported
        "builder": loaders.chain_record(be),
        "plugins": [PLUGIN_LIB_NAME] if lib else [],
        "plugin_library": {"file": PLUGIN_LIB_NAME, "source": str(lib.path), "sha256": lib.sha256,
                           "creators": list(lib.creators), "load_with": "IPluginRegistry.loadLibrary"}
        if lib else None,
        "onnx": {"folder": str(onnx_path.resolve()), "file": ONNX_FILE},
        "fp16_conversion": config.get("fp16_conversion"),
        "model": config or None,
        "recipe": rec.to_dict() if rec else None,
        "limits": vars(lim),
        "engines": [{
            "file": ENGINE_FILE,
            "sha256": hashlib.sha256(engine).hexdigest(),
            "size_bytes": len(engine),
            "inputs": _tensors(trt, network, inputs=True),
            "outputs": _tensors(trt, network, inputs=False),
            "profiles": [p.to_dict(i) for i, p in enumerate(profiles)],
            "select_profile": "context.set_optimization_profile_async(index, stream): 0 = prefill "
                              "(past length 0), 1 = decode (one new token)",
        }],
        "wide_nodes": report.to_dict(),
        "mask_outputs": masks,
        "timing_cache": str(cache_path),
        "build_seconds": round(time.perf_counter() - started, 3),
    }
    if not config:
        manifest.pop("model")
    files = {ENGINE_FILE: engine, MANIFEST: (json.dumps(manifest, indent=2) + "\n").encode()}
    copies = {PLUGIN_LIB_NAME: (lib.path, None)} if lib else {}
    if config:
        copies[WIDE_CONFIG] = (graph_dir / WIDE_CONFIG, graph_dir)
    from wide_export.export.genai_config import serving_files

    # The tokenizer and generation settings travel with the engine: `wide-export triton` serves text from them.
    copies.update({path.name: (path, graph_dir) for path in serving_files(graph_dir)})
    if timing_cache is None:
        files[TIMING_CACHE] = cache
    _write_outputs(out, files, copies, force)
    if timing_cache is not None:
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        cache_path.write_bytes(cache)
    return manifest


def build_engine(onnx_dir: Path, output_dir: Path, *, backend: Optional[str] = None, **kwargs: Any) -> dict[str, Any]:
    """Build OUT/wide.engine (+ manifest) from an ONNX folder; returns the manifest.

    kwargs: fp16, plugins (library path), limits ({max_batch, max_input_len,
    max_seq_len}, overriding the recipe's), recipe (file or shipped name),
    timing_cache, compute_capability (TensorRT-RTX), require_plugin_layers,
    mask_outputs (router masks as extra outputs, for verification), progress,
    force (replace an existing OUT that is not an engine folder; an engine folder is always replaced).
    With TensorRT-RTX the build runs in a child process (backend.py explains why).
    """
    args = {"onnx_dir": str(onnx_dir), "output_dir": str(output_dir), "backend": backend,
            **{k: (str(v) if isinstance(v, Path) else v) for k, v in kwargs.items()}}
    # Cheap checks first, so user errors do not wait for TensorRT (or a child process).
    if not (Path(onnx_dir) / ONNX_FILE).is_file():
        raise _no_onnx(Path(onnx_dir))
    check_engine_output(Path(onnx_dir), Path(output_dir), bool(kwargs.get("force")))
    _read_onnx_folder(Path(onnx_dir))  # its files lie inside onnx_dir before TensorRT (or a child) opens them
    base = load_recipe(args["recipe"]).limits if args.get("recipe") else ProfileLimits()
    base.override(**(args.get("limits") or {})).checked()
    if args.get("plugins") and not Path(args["plugins"]).is_file():
        raise WideError(f"plugin library {args['plugins']} not found",
                        hint="build it: wide-export build --tensorrt-include-dir DIR (plugins/trt/README.md)")
    if needs_child(backend):
        from wide_export.trt._child import run_in_child

        return run_in_child("wide_export.trt.build_engines:build_engine_here", args, rtx_child_env())
    with interrupt_on_signals():  # so a Ctrl-C swallowed by TensorRT's callbacks is still seen
        return build_engine_here(**args)


def summary_rows(manifest: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(op_type, plugin layers, inlined) rows of the plugin-layer report for a table."""
    by_op = manifest["wide_nodes"]["by_op"]
    return [(op, str(v["plugin_layers"]), str(v["inlined"])) for op, v in sorted(by_op.items())]


__all__ = ["build_engine", "build_engine_here", "summary_rows", "PluginReport"]
