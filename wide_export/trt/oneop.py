"""One-node networks, one per `wide` op: the unit under test for each plugin.

`one_op_model` writes a graph with a single `wide` node (attributes per
docs/opset.md, weights as initializers, its function body attached so it also
runs without plugins); `build_one_op_engine` builds it with dynamic batch and
token axes and reports whether the node became a plugin layer. The GPU tests
run the engine against wide_export.ops.reference; the CPU tests only build.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Optional

import numpy as np

from wide_export.base.errors import WideError
from wide_export.base.names import TIMING_CACHE
from wide_export.trt.backend import needs_child, rtx_child_env, select_backend

MAX_BATCH, MAX_TOKENS = 4, 8
MAX_KEYS = 2 * MAX_TOKENS  # WideMaskedAttention: keys = a past + the new tokens
ATTENTION_HEADS = (4, 2, 2)  # WideMaskedAttention's one-op graph: query heads, KV heads, heads per group
_NP = {"float32": np.float32, "float16": np.float16, "bfloat16": "bfloat16"}  # bfloat16: numpy dtype of ml_dtypes


def one_op_model(op: str, *, dtype: str = "float32", k: int = 64, n: int = 48, group_size: int = 16,
                 rank: int = 8, has_bias: bool = False, seed: int = 0) -> tuple[Any, dict[str, np.ndarray]]:
    """(onnx ModelProto with one `wide` node, its initializers by name)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from wide_export.ops.functions import function_protos
    from wide_export.ops.spec import DOMAIN, OPSET_VERSION, plugin_attrs

    rng = np.random.default_rng(seed)
    act = _NP[dtype]
    if act == "bfloat16":
        import ml_dtypes

        act = ml_dtypes.bfloat16
    act_t = helper.np_dtype_to_tensor_dtype(np.dtype(act))

    def weight(name: str, shape: tuple[int, ...], dt=act) -> str:
        weights[name] = (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(dt)
        return name

    weights: dict[str, np.ndarray] = {}
    dyn = ["batch", "tokens"]
    if op == "WideRouter":
        groups = n // group_size
        ins = ["hidden", weight("wc", (rank, k), np.float32), weight("bc", (rank,), np.float32),
               weight("wr", (2 * groups, rank), np.float32), weight("br", (2 * groups,), np.float32)]
        inputs = [helper.make_tensor_value_info("hidden", act_t, dyn + [k])]
        output = helper.make_tensor_value_info("y", TensorProto.INT32, dyn + [groups])
        attrs = plugin_attrs(num_groups=groups)
    elif op in ("WideMaskedGemmN", "WideMaskedGatedMlp", "WideMaskedGemmK"):
        groups = (k if op == "WideMaskedGemmK" else n) // group_size
        ws = [weight("w", (n, k))] + ([weight("w2", (n, k))] if op == "WideMaskedGatedMlp" else [])
        ins = ["x", *ws, "mask"]
        if op in ("WideMaskedGemmN", "WideMaskedGemmK"):  # like the exporter: always a bias, zeros when has_bias=0
            ins.append(weight("bias", (n,)))
            if not has_bias:
                weights["bias"] = np.zeros((n,), act)
        inputs = [helper.make_tensor_value_info("x", act_t, dyn + [k]),
                  helper.make_tensor_value_info("mask", TensorProto.INT32, dyn + [groups])]
        output = helper.make_tensor_value_info("y", act_t, dyn + [n])
        attrs = plugin_attrs(group_size=group_size,
                             **({"has_bias": int(has_bias)} if op in ("WideMaskedGemmN", "WideMaskedGemmK") else {}))
    elif op == "WideMaskedAttention":  # q [B, Hq, T, D], k / v [B, Hk, S, D], allowed [B, 1, T, S]; D = k
        heads, kv_heads, group_heads = ATTENTION_HEADS
        ins = ["q", "k", "v", "allowed", "head_mask"]
        inputs = [helper.make_tensor_value_info("q", act_t, ["batch", heads, "tokens", k]),
                  helper.make_tensor_value_info("k", act_t, ["batch", kv_heads, "keys", k]),
                  helper.make_tensor_value_info("v", act_t, ["batch", kv_heads, "keys", k]),
                  helper.make_tensor_value_info("allowed", TensorProto.BOOL, ["batch", 1, "tokens", "keys"]),
                  helper.make_tensor_value_info("head_mask", TensorProto.INT32, dyn + [heads // group_heads])]
        output = helper.make_tensor_value_info("y", act_t, ["batch", heads, "tokens", k])
        attrs = plugin_attrs(group_heads=group_heads)
    else:
        raise WideError(f"unknown wide op {op!r}")
    node = helper.make_node(op, ins, ["y"], domain=DOMAIN, name=f"/{op}", **attrs)
    graph = helper.make_graph([node], op, inputs, [output],
                              [numpy_helper.from_array(v, name) for name, v in weights.items()])
    opset = 18
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                    helper.make_opsetid(DOMAIN, OPSET_VERSION)],
                              functions=[f for f in function_protos(opset) if f.name == op])
    onnx.checker.check_model(model)
    return model, weights


def build_one_op_engine_here(onnx_path: str, engine_path: str, plugins: Optional[str] = None,
                             backend: Optional[str] = None, compute_capability: Optional[str] = None) -> dict:
    """Parse + build one one-op graph in this process; returns {"layers": [...], "plugin_layers": n}."""
    from wide_export.trt import loaders
    from wide_export.trt.plugins import load_plugin_library
    from wide_export.trt.profiles import Profile
    from wide_export.trt.report import plugin_layer_names

    be = select_backend(backend)
    trt = be.trt
    if plugins:
        load_plugin_library(be, Path(plugins))
    cc = loaders.rtx_target(be, compute_capability)
    loaders.use_flavour(be)
    builder, network, parser = loaders.parse_network(be, onnx_path)
    shapes = {}
    for i in range(network.num_inputs):
        t = network.get_input(i)
        shapes[t.name] = _profile_shapes(t.name, tuple(int(d) for d in t.shape))
    with tempfile.TemporaryDirectory(prefix="wide-cache-") as tmp:
        config = loaders.create_config(be, [Profile("all", shapes)], None, cc)
        plan = loaders.build_bytes(be, (builder, network, parser), config, str(Path(tmp) / TIMING_CACHE))
    Path(engine_path).write_bytes(plan)
    layers = [str(network.get_layer(i).type).split(".")[-1] for i in range(network.num_layers)]
    return {"layers": layers, "plugin_layers": len(plugin_layer_names(network, trt))}


def _profile_shapes(name: str, shape: tuple) -> tuple:
    """(min, opt, max) of one input: batch 1..MAX_BATCH, tokens 1..MAX_TOKENS, keys (attention) 1..MAX_KEYS with
    at least as many keys as tokens; the fixed axes as the graph has them."""
    if len(shape) == 4:  # WideMaskedAttention: q [B, Hq, T, D], k / v [B, Hk, S, D], allowed [B, 1, T, S]
        b, t, s = (1, 2, MAX_BATCH), (1, 4, MAX_TOKENS), (1, 6, MAX_KEYS)
        axes = {"q": (b, None, t, None), "k": (b, None, s, None), "v": (b, None, s, None),
                "allowed": (b, None, t, s)}[name]
        return tuple(tuple(shape[i] if axis is None else axis[j] for i, axis in enumerate(axes)) for j in range(3))
    last = shape[-1]
    return (1, 1, last), (2, 4, last), (MAX_BATCH, MAX_TOKENS, last)


def build_one_op_engine(onnx_path: Path, engine_path: Path, **kwargs: Any) -> dict:
    """build_one_op_engine_here, in a prepared child process when the backend needs one."""
    args = {"onnx_path": str(onnx_path), "engine_path": str(engine_path),
            **{k: (str(v) if isinstance(v, Path) else v) for k, v in kwargs.items()}}
    if needs_child(kwargs.get("backend")):
        from wide_export.trt._child import run_in_child

        return run_in_child("wide_export.trt.oneop:build_one_op_engine_here", args, rtx_child_env())
    return build_one_op_engine_here(**args)


def run_one_op_engine_here(engine_path: str, inputs_npz: str, output_npz: str, plugins: Optional[str] = None,
                           backend: Optional[str] = None) -> dict:
    """Run a one-op engine once on the GPU (torch CUDA tensors as bindings); writes output `y` to output_npz."""
    import torch

    from wide_export.trt.plugins import load_plugin_library

    be = select_backend(backend)
    trt = be.trt
    if plugins:
        load_plugin_library(be, Path(plugins))
    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    engine = runtime.deserialize_cuda_engine(Path(engine_path).read_bytes())
    if engine is None:
        raise WideError(f"{be.flavour} could not deserialize {engine_path}")
    context = engine.create_execution_context()
    feeds = {k: torch.from_numpy(v).cuda() for k, v in np.load(inputs_npz).items()}
    for name, tensor in feeds.items():
        context.set_input_shape(name, tuple(tensor.shape))
        context.set_tensor_address(name, tensor.data_ptr())
    shape = tuple(context.get_tensor_shape("y"))
    dtype = {"FLOAT": torch.float32, "HALF": torch.float16, "INT32": torch.int32}[
        str(engine.get_tensor_dtype("y")).split(".")[-1]]
    out = torch.full(shape, float("nan") if dtype.is_floating_point else -7, dtype=dtype, device="cuda")  # poisoned
    context.set_tensor_address("y", out.data_ptr())
    stream = torch.cuda.Stream()
    if not context.execute_async_v3(stream.cuda_stream):
        raise WideError("execute_async_v3 failed")
    stream.synchronize()
    np.savez(output_npz, y=out.cpu().numpy())
    return {"shape": list(shape)}


def run_one_op_engine(engine_path: Path, feeds: dict[str, np.ndarray], workdir: Path, **kwargs: Any) -> np.ndarray:
    """Run a one-op engine on `feeds`; returns output `y` (child process where the backend needs one)."""
    inputs, output = Path(workdir) / "inputs.npz", Path(workdir) / "output.npz"
    np.savez(inputs, **feeds)
    args = {"engine_path": str(engine_path), "inputs_npz": str(inputs), "output_npz": str(output),
            **{k: (str(v) if isinstance(v, Path) else v) for k, v in kwargs.items()}}
    if needs_child(kwargs.get("backend")):
        from wide_export.trt._child import run_in_child

        run_in_child("wide_export.trt.oneop:run_one_op_engine_here", args, rtx_child_env())
    else:
        run_one_op_engine_here(**args)
    return np.load(output)["y"]
