"""Convert a float32 export into the fp16 graph `wide-export onnx --dtype float16` would write.

The work is onnxconverter-common's `float16.convert_float_to_float16`; this module
only says which nodes stay float32, the same ones the fp16 export keeps float32
(checked node by node against it in tests/export/test_fp16.py):
  * `WideRouter` nodes: their weights stay float32 (initializers feeding a blocked
    node are not converted) and their function body casts `hidden` to float32;
  * the RMSNorm statistics (Pow -> ReduceMean -> Add -> Sqrt -> Reciprocal -> Mul);
    the weight scale after them runs in fp16, as in transformers;
  * the rotary angles (everything upstream of Cos/Sin) and the attention
    softmax with its masking Where;
  * the `logits` output (computed in fp16, cast to float32 as the fp16 export does).
The KV-cache inputs and outputs become float16 (keep_io_types=False).

The `wide` function bodies (model.functions) are left as they are: the converter
does not look inside them, and they are written type-generic (MatMul/CastLike
follow their inputs), except WideRouter's, which computes in float32 whatever
its `hidden` is. The converter keeps the blocked routers' float32 inputs; the
router's `hidden` is then re-pointed at the fp16 tensor (a Cast less), so every
`wide` node sees exactly the types of the fp16 export.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

KEEP_FP32_OPS = ("WideRouter", "Softmax")
# fp16's range: the converter clamps values outside it (the attention mask's
# float32 minimum becomes -65504, as torch's finfo(float16).min in the fp16 export).
FP16_MAX = 65504.0
FP16_MIN_POSITIVE = 2.0**-24
_FLOAT, _FLOAT16 = 1, 10
_INT_IO = ("input_ids", "attention_mask", "position_ids")
LOGITS = "logits"


def fp32_node_names(graph) -> list[str]:
    """Names of the standard nodes the fp16 export computes in float32 (see the module docstring)."""
    producer = {out: node for node in graph.node for out in node.output}
    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    keep: set[str] = set()
    stack = [n for n in graph.node if n.op_type in ("Cos", "Sin")]  # rotary angles
    while stack:
        node = stack.pop()
        if node.name not in keep:
            keep.add(node.name)
            stack.extend(producer[i] for i in node.input if i in producer)
    for node in graph.node:
        src = producer.get(node.input[0]) if node.input else None
        if node.op_type == "ReduceMean" and src is not None and src.op_type == "Pow":  # RMSNorm statistics
            keep |= {src.name, node.name}
            cur = node
            while len(nxt := consumers.get(cur.output[0], [])) == 1 and nxt[0].op_type in (
                    "Add", "Sqrt", "Reciprocal", "Div", "Mul"):
                cur = nxt[0]
                keep.add(cur.name)
                if cur.op_type == "Mul":  # x * rsqrt(...): the normalised value, still float32
                    break
        if node.op_type == "Softmax" and src is not None and src.op_type == "Where":  # masked scores
            keep.add(src.name)
    return sorted(keep)


def _float_tensors(graph):
    """(key, TensorProto) of every float tensor the converter may turn into float16: initializers by name,
    Constant nodes' values by node."""
    from onnx import AttributeProto

    yield from ((f"initializer {t.name}", t) for t in graph.initializer)
    for node in graph.node:
        for a in node.attribute:
            if a.type == AttributeProto.TENSOR:
                yield f"{node.op_type} {node.name}", a.t


def _out_of_fp16(graph) -> dict[str, tuple[int, int]]:
    """Per float32 tensor: (finite values beyond fp16's range, which the converter clamps to +-FP16_MAX;
    non-zero values below its smallest subnormal, which it rounds up to +-FP16_MIN_POSITIVE). float32's own
    +-max is not counted: it is the attention mask's fill value, which becomes fp16's +-65504 on purpose."""
    import numpy as np
    from onnx import numpy_helper

    out = {}
    for key, t in _float_tensors(graph):
        if t.data_type != _FLOAT:
            continue
        a = np.abs(numpy_helper.to_array(t).astype(np.float32, copy=False))
        big = int(np.count_nonzero((a > FP16_MAX) & (a < np.finfo(np.float32).max)))
        tiny = int(np.count_nonzero((a > 0) & (a < FP16_MIN_POSITIVE)))
        if big or tiny:
            out[key] = (big, tiny)
    return out


def convert_model(model, weights_dir: Path | None = None, dtype: str = "float16", clamped: dict | None = None):
    """The fp16 (or bf16) ModelProto for a float32 wide-export ModelProto; `model` is modified. With
    `weights_dir`, `model` was loaded without its external data, which is read after the shape
    inference (which cannot handle protos over 2 GB). dtype="bfloat16": the same graph with bfloat16
    where the fp16 one has float16 (to_bfloat16), the weights rounded from their float32 values.

    `clamped` (float16 only) receives what the converter clamped, counted here per tensor it converted
    (clamp_summary), instead of its one UserWarning per tensor, which names neither the tensor nor a count."""
    import warnings

    import onnx
    from onnx.shape_inference import infer_shapes
    from onnxconverter_common import float16

    graph = model.graph
    # The exporter records value_info for initializers too; the converter would then treat
    # them as activations (round to fp16, cast back) instead of keeping blocked nodes' weights.
    inits = {t.name for t in graph.initializer}
    kept = [v for v in graph.value_info if v.name not in inits]
    del graph.value_info[:]
    graph.value_info.extend(kept)
    model = infer_shapes(model)
    if weights_dir is not None:
        onnx.load_external_data_for_model(model, str(weights_dir))
    originals = {}
    if dtype == "bfloat16":  # float32 values, to round once to bf16 (not via fp16)
        from onnx import numpy_helper

        originals = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer if t.data_type == _FLOAT}
    before = _out_of_fp16(model.graph) if dtype == "float16" else {}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"the float32 number .* will be truncated", category=UserWarning)
        model = float16.convert_float_to_float16(
            model, min_positive_val=FP16_MIN_POSITIVE, max_finite_val=FP16_MAX, keep_io_types=False,
            disable_shape_infer=True, op_block_list=[*float16.DEFAULT_OP_BLOCK_LIST, *KEEP_FP32_OPS],
            node_block_list=fp32_node_names(model.graph))
    if clamped is not None:
        converted = {key for key, t in _float_tensors(model.graph) if t.data_type == _FLOAT16}
        clamped.update({key: counts for key, counts in before.items() if key in converted})
    _router_hidden_fp16(model.graph)
    _logits_fp32(model.graph)
    if dtype == "bfloat16":
        to_bfloat16(model.graph, originals)
    return model


def _router_hidden_fp16(graph) -> None:
    """Feed each WideRouter the fp16 residual stream, as the fp16 export does (its body casts it)."""
    producer = {out: node for node in graph.node for out in node.output}
    for node in graph.node:
        src = producer.get(node.input[0]) if node.op_type == "WideRouter" else None
        if src is not None and src.op_type == "Cast" and src.name == f"{node.name}_input_cast0":
            node.input[0] = src.input[0]
    used = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
    dead = [n for n in graph.node if n.op_type == "Cast" and not any(o in used for o in n.output)]
    for node in dead:
        graph.node.remove(node)


_BFLOAT16 = 16


def to_bfloat16(graph, originals: dict) -> None:
    """Turn the converter's fp16 graph into the bf16 one: every float16 type, Cast target and tensor
    (initializers from their float32 `originals` by name) becomes bfloat16. The float32 islands stay."""
    import ml_dtypes
    import numpy as np
    from onnx import AttributeProto, numpy_helper

    def bf16(t):
        src = originals.get(t.name)
        value = (src if src is not None else numpy_helper.to_array(t).astype(np.float32)).astype(ml_dtypes.bfloat16)
        new = numpy_helper.from_array(value, t.name)
        t.CopyFrom(new)

    for t in graph.initializer:
        if t.data_type == _FLOAT16:
            bf16(t)
    for node in graph.node:
        for a in node.attribute:
            if a.name == "to" and a.type == AttributeProto.INT and a.i == _FLOAT16:
                a.i = _BFLOAT16
            elif a.type == AttributeProto.TENSOR and a.t.data_type == _FLOAT16:
                bf16(a.t)
    for v in [*graph.input, *graph.output, *graph.value_info]:
        if v.type.tensor_type.elem_type == _FLOAT16:
            v.type.tensor_type.elem_type = _BFLOAT16


def _logits_fp32(graph) -> None:
    """`logits` stays a float32 output: the fp16 lm_head result cast to float32."""
    import onnx

    out = next((o for o in graph.output if o.name == LOGITS), None)
    if out is None:
        return
    for node in graph.node:
        if LOGITS in node.output:
            node.output[list(node.output).index(LOGITS)] = f"{LOGITS}_fp16"
    graph.node.append(onnx.helper.make_node("Cast", [f"{LOGITS}_fp16"], [LOGITS], to=_FLOAT, name="/logits/Cast"))
    out.type.tensor_type.elem_type = _FLOAT


def clamp_summary(clamped: dict[str, tuple[int, int]]) -> dict[str, Any]:
    """What the fp16 conversion changed beyond rounding, for wide_config.json's fp16_conversion."""
    big = {k: b for k, (b, _) in clamped.items() if b}
    return {"above_fp16_range": sum(big.values()), "above_fp16_range_tensors": sorted(big),
            "below_fp16_subnormal": sum(t for _, t in clamped.values())}


def clamp_note(config: dict[str, Any]) -> str | None:
    """One line about the values the fp16 conversion clamped where it matters (values beyond fp16's range,
    which change the engine's results), else None: values below fp16's smallest subnormal (2^-24) become
    +-2^-24, a change below fp16's resolution, and are only counted in wide_config.json."""
    info = (config.get("fp16_conversion") or {}).get("clamped") or {}
    n, where = info.get("above_fp16_range", 0), info.get("above_fp16_range_tensors", [])
    if not n:
        return None
    names = ", ".join(k.split(" ", 1)[-1] for k in where[:3]) + (f" and {len(where) - 3} more" if len(where) > 3
                                                                 else "")
    return (f"warning: {n} value{'s' * (n != 1)} beyond fp16's range (|x| > 65504) clamped to +-65504 in "
            f"{len(where)} tensor{'s' * (len(where) != 1)} ({names}): the fp16 engine computes with changed "
            f"weights there; compare it with `wide-export verify --engine`, or build without --fp16")


def fp16_config(config: dict[str, Any], external: bool, dtype: str = "float16",
                clamped: dict | None = None) -> dict[str, Any]:
    """wide_config.json of the converted graph: dtype float16 (or bfloat16), KV-cache I/O likewise, logits
    float32."""
    from onnxconverter_common import __version__ as converter_version

    from wide_export.export.onnx_export import DATA_NAME

    out = json.loads(json.dumps(config))
    out["dtype"] = dtype
    for entry in [*out.get("io", {}).get("inputs", []), *out.get("io", {}).get("outputs", [])]:
        if entry["name"] not in (*_INT_IO, LOGITS):
            entry["dtype"] = dtype
    out.setdefault("files", {})["external_data"] = DATA_NAME if external else None
    tool = f"onnxconverter-common {converter_version} float16.convert_float_to_float16"
    if dtype == "bfloat16":
        tool += ", then float16 -> bfloat16 (wide_export.export.fp16.to_bfloat16)"
    out["fp16_conversion"] = {"from": config.get("dtype", "float32"), "to": dtype,
                              "tool": tool,
                              "kept_float32": ["WideRouter", "RMSNorm statistics", "rotary angles",
                                               "attention softmax", "logits"]}
    if dtype == "float16":
        out["fp16_conversion"]["clamped"] = clamp_summary(clamped or {})
    return out


def convert_export(src: Path, dst: Path, dtype: str = "float16") -> dict[str, Any]:
    """Write dst/model.onnx (+ data) and dst/wide_config.json: the fp16 (or bf16) version of the float32
    export folder `src`. Returns the new wide_config. `dst` must exist."""
    import onnx

    from wide_export.base.errors import WideError
    from wide_export.export.onnx_export import (CONFIG_NAME, DATA_NAME, EXTERNAL_DATA_THRESHOLD, MODEL_NAME,
                                                read_wide_config)

    src, dst = Path(src), Path(dst)
    config = read_wide_config(src)
    if config.get("dtype") != "float32":
        raise WideError(f"{src} is a {config.get('dtype')} export; only a float32 one can be converted to {dtype}")
    clamped: dict = {}
    model = convert_model(onnx.load(str(src / MODEL_NAME), load_external_data=False), weights_dir=src, dtype=dtype,
                          clamped=clamped)
    size = sum(len(t.raw_data) for t in model.graph.initializer)
    external = size > EXTERNAL_DATA_THRESHOLD
    if external:
        onnx.save(model, str(dst / MODEL_NAME), save_as_external_data=True, all_tensors_to_one_file=True,
                  location=DATA_NAME, size_threshold=1024)
    else:
        onnx.save(model, str(dst / MODEL_NAME))
    new = fp16_config(config, external, dtype, clamped)
    (dst / CONFIG_NAME).write_text(json.dumps(new, indent=2) + "\n")
    return new
