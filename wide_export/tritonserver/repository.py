"""Write a Triton model repository for a WIDE model (onnxruntime or tensorrt flavour).

Layout (standard Triton):
    REPO/README.md
    REPO/<model>/config.pbtxt            generation model (Python backend)
    REPO/<model>/1/model.py              = wide_export/tritonserver/generation_model.py
    REPO/<model>/1/contract.py           = wide_export/tritonserver/contract.py (its inputs' and outputs' names, dtypes)
    REPO/<model>/1/settings.py           = wide_export/generation/settings.py (generation.json, the step type)
    REPO/<model>/1/rows.py               = wide_export/generation/rows.py (a request's rows, their checks, sampling)
    REPO/<model>/1/ortstep.py            = wide_export/generation/ortstep.py (the ONNX Runtime step)
    REPO/<model>/1/decoding.py           = wide_export/generation/decoding.py (the generation loop, in-flight batching)
    REPO/<model>/1/textgen.py            = wide_export/generation/textgen.py (tokenizer, stop rules, text)
    REPO/<model>/1/metrics.py            = wide_export/tritonserver/metrics.py (Prometheus metrics)
    REPO/<model>/1/generation.json       settings read by model.py (eos / pad ids included)
    REPO/<model>/1/tokenizer.json, ...   the export's tokenizer files and generation_config.json
    REPO/<model>/1/model.onnx(.data)     onnxruntime flavour
    REPO/<model>_engine/config.pbtxt     tensorrt flavour: one tensorrt_plan model per engine
    REPO/<model>_engine/1/model.plan     file, its instance group listing every profile
    REPO/*.so                            tensorrt flavour: the WIDE plugin library
The repository is assembled in a temp folder beside REPO and renamed into place,
so a failure leaves nothing half-written.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Optional

from wide_export.base.errors import WideError
from wide_export.base.names import ONNX_FILE
from wide_export.base.outdir import atomic_output_dir, check_output_dir
from wide_export.tritonserver.trt_engines import EngineSource, EngineSpec, ProfileSpec, read_engine_folder
from wide_export.tritonserver.export_folder import OnnxSource, read_onnx_folder
from wide_export.tritonserver import contract
from wide_export.tritonserver.templates import render
from wide_export.export.genai_config import serving_files
from wide_export.tritonserver.textfiles import check_tokenizer, generation_tokens

BACKENDS = ("onnxruntime", "tensorrt")
BATCHING = ("inflight", "static")
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")  # fullmatch: `$` would let a trailing newline through
_TYPE_TO_KV = {"TYPE_FP32": "float32", "TYPE_FP16": "float16"}
_RTX_NOTE = ("TensorRT-RTX engines need a TensorRT-RTX runtime; Triton's `tensorrt` backend links\n"
             "datacenter TensorRT, so rebuild the engines with datacenter TensorRT to serve them there.")


@dataclass(frozen=True)
class RepoOptions:
    """User choices for a generated repository."""

    model_name: str = "wide_llm"
    max_batch: int = 8
    instances: int = 1
    queue_delay_us: int = 2000
    intra_op_threads: int = 0  # ONNX Runtime threads per instance; 0 = its default
    streaming: bool = False  # decoupled generation model: one response per new token
    # Streaming only: "inflight" (requests join / leave the running batch at every step)
    # or "static" (each execute()'s requests generated together, start to end).
    batching: str = "inflight"

    def check(self) -> None:
        if self.batching not in BATCHING:
            raise WideError(f"unknown batching {self.batching!r}", hint=f"choose one of {', '.join(BATCHING)}")
        if not _NAME.fullmatch(self.model_name):
            raise WideError(f"model name {self.model_name!r} is not a valid Triton model name",
                            hint="use letters, digits, '_', '-', '.'")
        for field in ("max_batch", "instances"):
            if getattr(self, field) < 1:
                raise WideError(f"--{field.replace('_', '-')} must be >= 1, got {getattr(self, field)}")


def link_or_copy(src: Path, dst: Path) -> None:
    """Hard-link a big file of the user's own export when possible (same filesystem), else copy.

    A hard link shares the inode: writing through the repository's name changes the source. So we link
    only a file that is the user's own export output -- already confined to its folder by the readers
    (export_folder.py, trt_engines.py), a regular file owned by the user running us, with no other name
    (st_nlink == 1: not itself a hard link to some other file) -- and copy anything else (a file owned
    by someone else, or one already linked elsewhere, e.g. into an earlier repository). Symlinks are
    followed to their (confined) target, never linked as such.
    """
    from wide_export.base.paths import copy_from, open_confined

    real = Path(src).resolve()  # the readers confined `src` to its folder; here it is opened and checked once
    fd, info = open_confined(real, real.parent, "file")
    try:
        if info.st_uid == os.getuid() and info.st_nlink == 1:
            try:
                os.link(real, dst, follow_symlinks=False)
            except OSError:
                pass  # another filesystem, or links not allowed: copy
            else:  # keep the link only if it is the file that was checked (the name may have been swapped)
                linked = os.stat(dst, follow_symlinks=False)
                if (linked.st_dev, linked.st_ino) == (info.st_dev, info.st_ino):
                    return
                os.unlink(dst)
        copy_from(fd, info, dst)  # from the descriptor already checked, not a second open
    finally:
        os.close(fd)


# modules model.py loads from its folder, by the package they come from
SIBLINGS = {"wide_export.tritonserver": ("contract.py", "metrics.py"),
            "wide_export.generation": ("settings.py", "rows.py", "ortstep.py", "textgen.py", "decoding.py")}


def write_model_files(version: Path) -> None:
    """model.py (generation_model.py) and the siblings it loads from its folder."""
    (version / "model.py").write_text(files("wide_export.tritonserver").joinpath("generation_model.py").read_text())
    for package, names in SIBLINGS.items():
        for name in names:
            (version / name).write_text(files(package).joinpath(name).read_text())


def _write_generation_model(repo: Path, opts: RepoOptions, flavour: str, settings: dict, source: Path) -> Path:
    """The Python-backend model; `source` (export or engine folder) gives its tokenizer and eos ids."""
    settings.update(generation_tokens(source, settings["vocab_size"]))
    check_tokenizer(source, settings["vocab_size"])
    folder = repo / opts.model_name
    version = folder / "1"
    version.mkdir(parents=True)
    (folder / "config.pbtxt").write_text(render(
        "generation.pbtxt", flavour=flavour, model_name=opts.model_name, max_batch=settings.pop("_max_batch"),
        instances=opts.instances, queue_delay_us=opts.queue_delay_us, intra_op_threads=opts.intra_op_threads,
        decoupled="true" if opts.streaming else "false", batching=opts.batching if opts.streaming else "static",
        inputs=contract.pbtxt(contract.INPUTS), outputs=contract.pbtxt(contract.OUTPUTS),
    ))
    write_model_files(version)
    (version / "generation.json").write_text(json.dumps({"flavour": flavour, **settings}, indent=2) + "\n")
    from wide_export.base.paths import copy_confined

    for path in serving_files(source):
        copy_confined(path, version / path.name, source, "tokenizer file")  # from the file that was checked
    return version


def _onnx_repository(repo: Path, src: OnnxSource, opts: RepoOptions) -> None:
    shape = src.shape
    settings = {
        "num_layers": shape.num_layers, "num_kv_heads": shape.num_kv_heads, "head_dim": shape.head_dim,
        "vocab_size": shape.vocab_size, "kv_dtype": shape.kv_dtype,
        "max_total_tokens": shape.max_position_embeddings, "io": src.io, "onnx_file": ONNX_FILE,
        "_max_batch": opts.max_batch,
    }
    version = _write_generation_model(repo, opts, "onnxruntime", settings, src.folder)
    for path in (src.onnx_file, *src.data_files, src.folder / "wide_config.json"):
        link_or_copy(path, version / path.name)
    (repo / "README.md").write_text(render(
        "readme_onnxruntime.txt", model_name=opts.model_name, source=str(src.folder),
        max_total_tokens=shape.max_position_embeddings,
    ))


def _plan_models(src: EngineSource, opts: RepoOptions) -> list[tuple[str, EngineSpec]]:
    """One tensorrt_plan model per engine file (so its weights are on each GPU once).

    Triton's TensorRT backend deserializes the plan once per model instance
    (tensorrt_backend src/model_state.cc ModelState::CreateEngine shares an engine
    across instances only when it has no dynamic shapes, and ours have), creates one
    execution context per profile listed in the instance group
    (src/instance_state.cc InitOptimizationProfiles) and runs each request on the
    profile whose min/max ranges hold the request's shapes, nearest to `opt`
    (src/instance_state.cc GetMostOptimizedProfile / EvaluateTensorRTContext).
    """
    if len(src.engines) == 1:
        return [(f"{opts.model_name}_engine", src.engines[0])]
    return [(f"{opts.model_name}_engine{j}", engine) for j, engine in enumerate(src.engines)]


def _pick(models: list, phases: tuple[str, ...], what: str, manifest: Path) -> tuple[str, EngineSpec, ProfileSpec]:
    for phase in phases:
        for name, engine in models:
            for prof in engine.profiles:
                if prof.phase == phase:
                    return name, engine, prof
    raise WideError(f"{manifest}: no optimization profile for the {what} phase",
                    hint="build the engine with prefill and decode profiles")


def _tensor_block(tensors) -> str:
    return ",\n".join(
        render("tensor.pbtxt", name=t.name, data_type=t.data_type, dims=", ".join(str(d) for d in t.dims)).rstrip()
        for t in tensors
    )


def _engine_limits(src: EngineSource, prefill: ProfileSpec, decode: ProfileSpec, opts: RepoOptions) -> dict:
    io = src.io
    max_total = src.shape.max_position_embeddings
    total_cap = decode.max_dim(io["attention_mask"], 1)
    if total_cap:
        max_total = min(max_total, total_cap)
    max_prompt = prefill.max_dim(io["input_ids"], 1) or 0
    batch = opts.max_batch
    for prof in (prefill, decode):
        cap = prof.max_dim(io["input_ids"], 0)
        if cap:
            batch = min(batch, cap)
    return {"max_total_tokens": max_total, "max_prompt_tokens": min(max_prompt, max_total), "_max_batch": batch}


def _tensorrt_repository(repo: Path, src: EngineSource, opts: RepoOptions) -> None:
    models = _plan_models(src, opts)
    prefill = _pick(models, ("prefill", "both"), "prefill", src.manifest)
    decode = _pick(models, ("decode", "both"), "decode", src.manifest)
    past = {t.name: t for t in decode[1].inputs}[src.io["past_key"].format(i=0)]
    if past.data_type not in _TYPE_TO_KV:
        raise WideError(f"{src.manifest}: KV cache type {past.data_type} is not served (FP32/FP16 only)")
    for name, engine in models:
        version = repo / name / "1"
        version.mkdir(parents=True)
        link_or_copy(engine.file, version / "model.plan")
        (repo / name / "config.pbtxt").write_text(render(
            "tensorrt_plan.pbtxt", manifest=src.manifest.name, engine=engine.file.name, model_name=name,
            profiles=", ".join(f'"{p.index}"' for p in engine.profiles),
            profile_list=", ".join(f"{p.index} ({p.phase})" for p in engine.profiles),
            inputs=_tensor_block(engine.inputs), outputs=_tensor_block(engine.outputs),
        ))
    shape = src.shape
    settings = {
        "num_layers": shape.num_layers, "num_kv_heads": shape.num_kv_heads, "head_dim": shape.head_dim,
        "vocab_size": shape.vocab_size, "kv_dtype": _TYPE_TO_KV[past.data_type], "io": src.io,
        # One engine holding both profiles (what `wide-export trt` builds): one model for both phases.
        # Engines split across files keep a model per file, named per phase.
        **({"engine_model": prefill[0]} if prefill[0] == decode[0]
           else {"prefill_model": prefill[0], "decode_model": decode[0]}),
        "kv_cache_memory": "gpu", **_engine_limits(src, prefill[2], decode[2], opts),
    }
    max_total = settings["max_total_tokens"]
    version = _write_generation_model(repo, opts, "tensorrt", settings, src.folder)
    link_or_copy(src.manifest, version / src.manifest.name)
    if src.plugins:
        # Files at the repository root are ignored by Triton (only folders are models).
        for plugin in src.plugins:
            link_or_copy(plugin, repo / plugin.name)
        plugins = render("plugins_listed.txt", plugin_files=", ".join(p.name for p in src.plugins),
                         plugin_file=src.plugins[0].name)
    else:
        plugins = render("plugins_none.txt")
    (repo / "README.md").write_text(render(
        "readme_tensorrt.txt", model_name=opts.model_name, source=str(src.folder),
        plan_models=", ".join(f"`{m[0]}`" for m in models), prefill=f"`{prefill[0]}` profile {prefill[2].index}",
        decode=f"`{decode[0]}` profile {decode[2].index}", trt_name=src.trt_package,
        trt_version=src.trt_version, trt_note=_RTX_NOTE if "rtx" in src.trt_package.lower() else "",
        plugin_section=plugins.rstrip(), max_total_tokens=max_total,
    ))


def _warn(line: str) -> None:
    """One yellow line on stderr, before anything is written."""
    from rich.console import Console

    Console(stderr=True, highlight=False).print(line, style="yellow", markup=False, soft_wrap=True)


def generate_repository(
    output: Path,
    onnx: Optional[Path] = None,
    engines: Optional[Path] = None,
    backend: Optional[str] = None,
    options: RepoOptions = RepoOptions(),
) -> Path:
    """Write a model repository at `output` from an ONNX folder or an engine folder."""
    if (onnx is None) == (engines is None):
        raise WideError("give exactly one of --onnx DIR or --engines DIR")
    backend = backend or ("onnxruntime" if onnx is not None else "tensorrt")
    if backend not in BACKENDS:
        raise WideError(f"unknown backend {backend!r}", hint=f"choose one of {', '.join(BACKENDS)}")
    if (backend == "onnxruntime") != (onnx is not None):
        if backend == "onnxruntime":
            raise WideError("the onnxruntime flavour needs --onnx DIR, not --engines (TensorRT engines run in "
                            "Triton's tensorrt backend)",
                            hint="pass --onnx with the `wide-export onnx` folder the engines were built from, or "
                                 "drop --backend to serve the engines with --backend tensorrt")
        raise WideError("the tensorrt flavour needs --engines DIR, not --onnx",
                        hint="build engines first (wide-export trt --onnx DIR --output ENGINES) and pass "
                             "--engines ENGINES, or drop --backend to serve the ONNX export with onnxruntime")
    options.check()
    output = Path(output)
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise WideError(f"{output} exists and is not empty", hint="choose a new --output folder")
    empty = output.exists()  # an empty folder may be replaced
    check_output_dir(output, force=empty, protect=(onnx, engines))
    source = read_onnx_folder(onnx) if onnx is not None else read_engine_folder(engines)
    if engines is not None and "rtx" in str(source.trt_package).lower():
        _warn(f"warning: {engines} holds TensorRT-RTX engines ({source.trt_package} {source.trt_version}); "
              "Triton's tensorrt backend links datacenter TensorRT and cannot load them (rebuild them with "
              "datacenter TensorRT: wide-export trt --backend tensorrt, on the GPU you serve from)")
    with atomic_output_dir(output, force=empty) as staging:
        if backend == "onnxruntime":
            _onnx_repository(staging, source, options)
        else:
            _tensorrt_repository(staging, source, options)
    return output


__all__ = ["BACKENDS", "BATCHING", "RepoOptions", "generate_repository"]
