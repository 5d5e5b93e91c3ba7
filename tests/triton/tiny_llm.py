"""A tiny KV-cache LLM built with onnx.helper, following the graph contract,
plus a numpy reference that recomputes the whole sequence without a cache.

It lets the generation model's decode loop be tested in isolation (left padding,
cache growth, position ids) without the real export.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

VOCAB, HIDDEN, KV_HEADS, HEAD_DIM, LAYERS, MAX_POS = 61, 16, 2, 4, 2, 64


def make_weights(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    w = {"emb": rng.normal(size=(VOCAB, HIDDEN)), "pos": rng.normal(size=(MAX_POS, HIDDEN)),
         "out": rng.normal(size=(HIDDEN, VOCAB))}
    for i in range(LAYERS):
        for name in ("q", "k", "v"):
            w[f"{name}{i}"] = rng.normal(size=(HIDDEN, KV_HEADS * HEAD_DIM)) / np.sqrt(HIDDEN)
        w[f"o{i}"] = rng.normal(size=(KV_HEADS * HEAD_DIM, HIDDEN)) / np.sqrt(HIDDEN)
    return {k: v.astype(np.float32) for k, v in w.items()}


def reference_logits(w: dict, ids: np.ndarray) -> np.ndarray:
    """Logits of the last position for one unpadded sequence (full recompute)."""
    t = ids.size
    x = w["emb"][ids] + w["pos"][np.arange(t)]
    for i in range(LAYERS):
        def heads(m):
            return (x @ w[m + str(i)]).reshape(t, KV_HEADS, HEAD_DIM).transpose(1, 0, 2)
        q, k, v = heads("q"), heads("k"), heads("v")
        s = q @ k.transpose(0, 2, 1) / np.sqrt(HEAD_DIM)
        s = np.where(np.tril(np.ones((t, t), bool)), s, -1e9)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        x = x + (p @ v).transpose(1, 0, 2).reshape(t, -1) @ w[f"o{i}"]
    return x[-1] @ w["out"]


def reference_greedy(w: dict, prompt: np.ndarray, new: int) -> np.ndarray:
    seq = list(prompt)
    for _ in range(new):
        seq.append(int(np.argmax(reference_logits(w, np.array(seq)))))
    return np.array(seq[len(prompt):], dtype=np.int64)


def _graph(w: dict) -> onnx.ModelProto:
    nodes, inits = [], [numpy_helper.from_array(v, k) for k, v in w.items()]
    c = lambda name, arr: inits.append(numpy_helper.from_array(np.asarray(arr), name))  # noqa: E731
    c("scale", np.float32(1 / np.sqrt(HEAD_DIM)))
    c("neg", np.float32(-1e9))
    c("shape_split", np.array([0, 0, KV_HEADS, HEAD_DIM], np.int64))
    c("shape_merge", np.array([0, 0, KV_HEADS * HEAD_DIM], np.int64))
    c("zero", np.int64(0))
    c("one", np.int64(1))
    c("ax1", np.array([1], np.int64))
    c("ax12", np.array([1, 2], np.int64))
    n = lambda op, ins, outs, **kw: nodes.append(helper.make_node(op, ins, outs, **kw))  # noqa: E731
    n("Gather", ["emb", "input_ids"], ["tok"])
    n("Gather", ["pos", "position_ids"], ["posv"])
    n("Add", ["tok", "posv"], ["x0"])
    # allowed[b, 1, t, s] = s <= past + t and attention_mask[b, s]
    n("Shape", ["attention_mask"], ["mshape"])
    n("Gather", ["mshape", "one"], ["total"])
    n("Shape", ["input_ids"], ["ishape"])
    n("Gather", ["ishape", "one"], ["tlen"])
    n("Sub", ["total", "tlen"], ["past"])
    n("Range", ["past", "total", "one"], ["qidx"])
    n("Range", ["zero", "total", "one"], ["kidx"])
    n("Unsqueeze", ["qidx", "ax1"], ["qcol"])
    n("LessOrEqual", ["kidx", "qcol"], ["causal"])
    n("Cast", ["attention_mask"], ["mbool"], to=TensorProto.BOOL)
    n("Unsqueeze", ["mbool", "ax12"], ["m4"])
    n("And", ["causal", "m4"], ["allowed"])
    x = "x0"
    for i in range(LAYERS):
        for m in ("q", "k", "v"):
            n("MatMul", [x, f"{m}{i}"], [f"{m}{i}_flat"])
            n("Reshape", [f"{m}{i}_flat", "shape_split"], [f"{m}{i}_4"])
            n("Transpose", [f"{m}{i}_4"], [f"{m}{i}_h"], perm=[0, 2, 1, 3])
        n("Concat", [f"past_key_values.{i}.key", f"k{i}_h"], [f"present.{i}.key"], axis=2)
        n("Concat", [f"past_key_values.{i}.value", f"v{i}_h"], [f"present.{i}.value"], axis=2)
        n("Transpose", [f"present.{i}.key"], [f"kt{i}"], perm=[0, 1, 3, 2])
        n("MatMul", [f"q{i}_h", f"kt{i}"], [f"s{i}_raw"])
        n("Mul", [f"s{i}_raw", "scale"], [f"s{i}"])
        n("Where", ["allowed", f"s{i}", "neg"], [f"s{i}_m"])
        n("Softmax", [f"s{i}_m"], [f"p{i}"], axis=-1)
        n("MatMul", [f"p{i}", f"present.{i}.value"], [f"a{i}"])
        n("Transpose", [f"a{i}"], [f"a{i}_t"], perm=[0, 2, 1, 3])
        n("Reshape", [f"a{i}_t", "shape_merge"], [f"a{i}_m"])
        n("MatMul", [f"a{i}_m", f"o{i}"], [f"o{i}_out"])
        n("Add", [x, f"o{i}_out"], [f"x{i + 1}"])
        x = f"x{i + 1}"
    n("MatMul", [x, "out"], ["logits"])
    kv = lambda name, seq: helper.make_tensor_value_info(  # noqa: E731
        name, TensorProto.FLOAT, ["batch", KV_HEADS, seq, HEAD_DIM])
    inputs = [helper.make_tensor_value_info(nm, TensorProto.INT64, ["batch", s]) for nm, s in
              (("input_ids", "seq"), ("attention_mask", "total"), ("position_ids", "seq"))]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq", VOCAB])]
    for i in range(LAYERS):
        inputs += [kv(f"past_key_values.{i}.key", "past"), kv(f"past_key_values.{i}.value", "past")]
        outputs += [kv(f"present.{i}.key", "total"), kv(f"present.{i}.value", "total")]
    graph = helper.make_graph(nodes, "tiny_llm", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def write_tiny_model(folder: Path, seed: int) -> dict[str, np.ndarray]:
    """Write model.onnx + wide_config.json into `folder`; return the weights."""
    folder.mkdir(parents=True, exist_ok=True)
    w = make_weights(seed)
    onnx.save(_graph(w), str(folder / "model.onnx"))
    (folder / "wide_config.json").write_text(json.dumps({
        "num_layers": LAYERS, "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "vocab_size": VOCAB,
        "dtype": "float32", "max_position_embeddings": MAX_POS,
    }))
    return w
