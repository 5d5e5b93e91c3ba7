"""verify/slices.py on a hand-built graph small enough to compute by hand (in numpy) and to run whole in
ONNX Runtime: the cut (slice names, borders, weights), the slice-major stepping with the graph's own
presents, a later layer's past borrowed from the reference, and the reference-fed per-layer runs.

The graph, with x [1, 4], pasts [1, P] (float32):
    prologue  h0 = x * E + sum(past_key_values.1.key) * C       (reads layer 1's past, as data)
    layer 0   a0 = h0 + W0;  present.0.key = concat(past.0, a0);  h1 = relu(a0)
    layer 1   a1 = h1 * W1;  present.1.key = concat(past.1, a1);  h2 = a1
    head      logits = h2 * N
"""

from __future__ import annotations

import numpy as np
import pytest

from wide_export.verify.slices import Slice, SlicedRun, plan_slices, run_sliced

E = np.array([1.0, -2.0, 0.5, 3.0], np.float32)
W0 = np.array([0.5, 1.0, -4.0, 0.25], np.float32)
W1 = np.array([2.0, -1.0, 1.5, 0.5], np.float32)
N = np.array([1.0, 0.5, -1.0, 2.0], np.float32)
C = np.array(0.125, np.float32)


def _graph(past_read: str = "ReduceSum", order=(0, 1), extra_nodes=(), layer0_shape_read=False, int_crossing=False,
           prologue_output=False, big=False):
    """The graph above, the head's product as a local function `wide.Scale`. past_read='Shape': the prologue
    reads layer 1's past only for its Shape; layer0_shape_read: layer 0 reads it for its Shape too;
    int_crossing: layer 1 also reads an int64 value of the stream's shape from layer 0; prologue_output:
    `psum` is a graph output; big: the prologue holds a 3 MiB weight."""
    from onnx import TensorProto, helper, numpy_helper

    def init(name, value):
        return numpy_helper.from_array(np.asarray(value), name)

    prologue = [helper.make_node("Mul", ["x", "E"], ["xe"], name="/model/embed_tokens/Mul")]
    if past_read == "Shape":
        prologue += [helper.make_node("Shape", ["past_key_values.1.key"], ["psh"], name="/model/Shape"),
                     helper.make_node("Cast", ["psh"], ["pshf"], to=TensorProto.FLOAT, name="/model/Cast"),
                     helper.make_node("ReduceSum", ["pshf"], ["psum"], keepdims=0, name="/model/Sum"),
                     helper.make_node("Mul", ["psum", "Z"], ["pc"], name="/model/Mul")]
    else:
        prologue += [helper.make_node("ReduceSum", ["past_key_values.1.key"], ["psum"], keepdims=0,
                                      name="/model/Sum"),
                     helper.make_node("Mul", ["psum", "C"], ["pc"], name="/model/Mul")]
    prologue.append(helper.make_node("Add", ["xe", "pc"], ["h0"], name="/model/Add"))
    if big:
        prologue.append(helper.make_node("ReduceSum", ["BIG"], ["bigsum"], keepdims=0, name="/model/Big"))
    layers = {
        0: [helper.make_node("Add", ["h0", "W0"], ["a0"], name="/model/layers.0/Add"),
            helper.make_node("Concat", ["past_key_values.0.key", "a0"], ["present.0.key"], axis=1,
                             name="/model/layers.0/Concat"),
            helper.make_node("Relu", ["a0"], ["h1"], name="/model/layers.0/Relu")],
        1: [helper.make_node("Mul", ["h1", "W1"], ["a1"], name="/model/layers.1/Mul"),
            helper.make_node("Concat", ["past_key_values.1.key", "a1"], ["present.1.key"], axis=1,
                             name="/model/layers.1/Concat"),
            helper.make_node("Identity", ["a1"], ["h2"], name="/model/layers.1/Identity")],
    }
    if layer0_shape_read:
        layers[0].append(helper.make_node("Shape", ["past_key_values.1.key"], ["l0sh"], name="/model/layers.0/Shape"))
    if int_crossing:
        layers[0].append(helper.make_node("Cast", ["a0"], ["a0i"], to=TensorProto.INT64, name="/model/layers.0/Cast"))
        layers[1].append(helper.make_node("Cast", ["a0i"], ["a0f"], to=TensorProto.FLOAT, name="/model/layers.1/Cast"))
    head = [helper.make_node("Scale", ["h2", "N"], ["logits"], domain="wide", name="/model/norm/Scale")]
    nodes = prologue + [n for i in order for n in layers[i]] + list(extra_nodes) + head
    f = TensorProto.FLOAT
    scale = helper.make_function("wide", "Scale", ["a", "b"], ["c"], [helper.make_node("Mul", ["a", "b"], ["c"])],
                                 opset_imports=[helper.make_opsetid("", 17)])
    outputs = ["logits", "present.0.key", "present.1.key"] + (["psum"] if prologue_output else [])
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", f, [1, 4]),
         helper.make_tensor_value_info("past_key_values.0.key", f, [1, "p"]),
         helper.make_tensor_value_info("past_key_values.1.key", f, [1, "p"])],
        [helper.make_tensor_value_info(n, f, None) for n in outputs],
        initializer=[init("E", E), init("W0", W0), init("W1", W1), init("N", N), init("C", C),
                     init("Z", np.array(0.0, np.float32)), init("unused", np.zeros(3, np.float16))]
        + ([init("BIG", np.zeros(3 * 2**18, np.float32))] if big else []))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("wide", 1)],
                             functions=[scale], ir_version=8)


def _session(proto):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])


XS = [np.array([[1.0, 2.0, 3.0, 4.0]], np.float32), np.array([[0.5, -1.0, 2.0, 1.0]], np.float32),
      np.array([[-1.0, 1.0, 0.25, 2.0]], np.float32)]


def _feeds():
    empty = np.zeros((1, 0), np.float32)
    return [{"x": XS[0], "past_key_values.0.key": empty, "past_key_values.1.key": empty},
            {"x": XS[1]}, {"x": XS[2]}]


def _by_hand(steps, borrowed_past1=None):
    """The graph's outputs per step in numpy; borrowed_past1[k]: what the prologue reads as layer 1's past
    at step k (default: the graph's own)."""
    past0 = past1 = np.zeros((1, 0), np.float32)
    out = []
    for k in range(steps):
        read = past1 if borrowed_past1 is None or k == 0 else borrowed_past1[k]
        h0 = XS[k] * E + read.sum() * C
        a0 = h0 + W0
        a1 = np.maximum(a0, 0) * W1
        past0, past1 = np.concatenate([past0, a0], 1), np.concatenate([past1, a1], 1)
        out.append({"logits": a1 * N, "present.0.key": past0, "present.1.key": past1})
    return out


def _whole(proto, feeds):
    sess = _session(proto)
    outs = []
    for k, feed in enumerate(feeds):
        feed = dict(feed)
        if k:
            feed.update({f"past_key_values.{i}.key": outs[-1][f"present.{i}.key"] for i in range(2)})
        outs.append(dict(zip(["logits", "present.0.key", "present.1.key"],
                             sess.run(["logits", "present.0.key", "present.1.key"], feed))))
    return outs


# -- the cut
def test_plan_cuts_prologue_layers_head_with_their_borders_and_weights():
    pieces = plan_slices(_graph().graph)
    assert [p.name for p in pieces] == ["prologue", "layer 0", "layer 1", "head"]
    assert [len(p.nodes) for p in pieces] == [4, 3, 3, 1]
    assert [p.inputs for p in pieces] == [
        ["x", "past_key_values.1.key"], ["h0", "past_key_values.0.key"], ["h1", "past_key_values.1.key"], ["h2"]]
    assert [p.outputs for p in pieces] == [["h0"], ["present.0.key", "h1"], ["present.1.key", "h2"], ["logits"]]
    assert [sorted(t.name for t in p.initializers) for p in pieces] == [["C", "E"], ["W0"], ["W1"], ["N"]]
    assert [p.weight_bytes for p in pieces] == [4 + 16, 16, 16, 16]  # C is a float32 scalar


def test_plan_refuses_graphs_it_cannot_cut():
    from onnx import helper

    g = _graph().graph
    for node in g.node:
        node.name = node.name.replace("/layers.", "/blocks.")
    with pytest.raises(ValueError, match="/model/layers.N/"):
        plan_slices(g)
    with pytest.raises(ValueError, match="layer order"):
        plan_slices(_graph(order=(1, 0)).graph)
    dangling = helper.make_node("Neg", ["nowhere"], ["n"], name="/model/layers.0/Neg")  # nothing makes `nowhere`
    with pytest.raises(ValueError, match="^layer 1 reads nowhere "):
        plan_slices(_graph(extra_nodes=[dangling]).graph)
    late = helper.make_node("Neg", ["logits"], ["late"], name="/model/layers.1/Neg")  # reads the head's value
    with pytest.raises(ValueError, match="^layer 1 reads logits "):
        plan_slices(_graph(extra_nodes=[late]).graph)


def test_values_a_subgraph_takes_from_the_outer_scope_are_border_inputs():
    """An If in layer 1 whose branches read h1 from outside: h1 crosses into layer 1 (and its own values not)."""
    from onnx import TensorProto, helper

    from onnx import numpy_helper

    def branch(name, op):  # reads a0 from layer 0 (layer 1 reads it nowhere else) and its own initializer
        return helper.make_graph([helper.make_node(op, ["a0"], [f"{name}_out"]),
                                  helper.make_node("Add", [f"{name}_out", f"{name}_w"], [f"{name}_res"])],
                                 name, [], [helper.make_tensor_value_info(f"{name}_res", TensorProto.FLOAT, None)],
                                 initializer=[numpy_helper.from_array(np.ones(4, np.float32), f"{name}_w")])

    model = _graph()
    g = model.graph
    cond = helper.make_node("Constant", [], ["cond"], name="/model/layers.1/Cond",
                            value=helper.make_tensor("c", TensorProto.BOOL, [], [True]))
    iff = helper.make_node("If", ["cond"], ["branched"], name="/model/layers.1/If",
                           then_branch=branch("then", "Neg"), else_branch=branch("else", "Relu"))
    at = [n.name for n in g.node].index("/model/layers.1/Mul")
    g.node.insert(at, iff)
    g.node.insert(at, cond)
    g.output.append(helper.make_tensor_value_info("branched", TensorProto.FLOAT, None))
    layer0, layer1 = plan_slices(g)[1:3]
    # cond is its own; then_out, then_w, ... are the branches' own
    assert layer1.inputs == ["a0", "h1", "past_key_values.1.key"]
    assert "branched" in layer1.outputs and "a0" in layer0.outputs


# -- the run
def test_sliced_run_is_the_whole_graph_and_the_hand_computation():
    proto = _graph()
    feeds = _feeds()
    whole = _whole(proto, feeds)
    run = run_sliced(proto, _session, feeds, [dict(w) for w in whole])  # the reference = the graph itself
    hand = _by_hand(3)
    assert len(run.outputs) == 3
    for k in range(3):
        assert set(run.outputs[k]) == {"logits", "present.0.key", "present.1.key"}
        for name in hand[k]:
            assert np.array_equal(run.outputs[k][name], whole[k][name]), (k, name)
            np.testing.assert_allclose(run.outputs[k][name], hand[k][name], rtol=1e-6)
    assert run.slices == [("prologue", 4, 20), ("layer 0", 3, 16), ("layer 1", 3, 16), ("head", 1, 16)]
    assert run.borrowed == {"past_key_values.1.key": True}  # the prologue sums it: read as data
    assert run.per_layer is None
    assert feeds[1].keys() == {"x"}  # the caller's feeds are not filled in


def test_a_later_layers_past_is_borrowed_from_the_reference_of_the_step_before():
    """The prologue of step k runs before layer 1 made step k-1's present: it reads the reference's
    present.1.key of step k-1 (cast to the graph's float32), here 1 + the graph's own."""
    proto = _graph()
    feeds = _feeds()
    own = _by_hand(3)
    reference = [{n: (v + 1.0).astype(np.float64) for n, v in o.items()} for o in own]
    run = run_sliced(proto, _session, feeds, reference)
    hand = _by_hand(3, borrowed_past1=[None, reference[0]["present.1.key"], reference[1]["present.1.key"]])
    for k in range(3):
        for name in hand[k]:
            np.testing.assert_allclose(run.outputs[k][name], hand[k][name], rtol=1e-6, err_msg=f"{k} {name}")
    assert run.outputs[1]["logits"].dtype == np.float32
    assert not np.allclose(run.outputs[1]["logits"], own[1]["logits"])  # the borrowed value mattered


def test_a_past_read_only_for_its_shape_is_reported_as_such():
    proto = _graph(past_read="Shape")
    run = run_sliced(proto, _session, _feeds(), [dict(w) for w in _whole(proto, _feeds())])
    assert run.borrowed == {"past_key_values.1.key": False}
    assert "(read only for their Shape)" in run.describe()


def test_each_slice_is_reported_through_progress():
    said = []
    proto = _graph()
    run_sliced(proto, _session, _feeds(), _whole(proto, _feeds()), progress=said.append)
    assert said == ["slice 1/4: prologue (0 MiB of weights)", "slice 2/4: layer 0 (0 MiB of weights)",
                    "slice 3/4: layer 1 (0 MiB of weights)", "slice 4/4: head (0 MiB of weights)"]


def test_a_feed_that_lacks_an_input_is_named():
    proto = _graph()
    feeds = _feeds()
    del feeds[0]["past_key_values.1.key"]
    with pytest.raises(ValueError, match="^prologue reads past_key_values.1.key,"):
        run_sliced(proto, _session, feeds, [{}] * 3)
    feeds = _feeds()
    del feeds[1]["x"]  # a decode step without its input: not a past, nothing stands in for it
    with pytest.raises(ValueError, match="^prologue reads x,"):
        run_sliced(proto, _session, feeds, [{}] * 3)


def test_reference_fed_runs_check_each_layer_on_the_reference_state():
    """per_layer: layer 1 and the head run on the reference's residual stream (here: the graph's own + 1)
    and, in decode steps, the reference's past; layer 0 keeps the prologue's own output (checked too).
    Layer 1 also reads an int64 value of the stream's shape from layer 0: not taken for the stream; the
    prologue's graph output `psum` is the chained one."""
    proto = _graph(int_crossing=True, prologue_output=True)
    feeds = _feeds()
    own = _by_hand(3)
    whole = _whole(proto, feeds)
    hidden, refs = [], []
    past1 = np.zeros((1, 0), np.float32)
    for k in range(3):
        h0 = XS[k] * E + past1.sum() * C  # the graph's own h0 at step k (own past)
        a0 = h0 + W0
        h1 = np.maximum(a0, 0)
        hidden.append([h0 + 5.0, h1 + 1.0, h1 * W1 + 2.0])  # entering layer 0, layer 1, the head
        past1 = own[k]["present.1.key"]
    refs = [{n: v + 0.5 for n, v in w.items()} for w in whole]  # the reference's presents
    run = run_sliced(proto, _session, feeds, refs, reference_hidden=hidden)
    assert run.per_layer is not None and len(run.per_layer) == 3
    chained = _by_hand(3, borrowed_past1=[None, refs[0]["present.1.key"], refs[1]["present.1.key"]])
    for k in range(3):
        got = run.per_layer[k]
        assert set(got) == {"logits", "present.0.key", "present.1.key", "psum", "layer_output.0", "layer_output.1"}
        assert np.array_equal(got["psum"], run.outputs[k]["psum"])
        # the head on the reference's stream entering it
        np.testing.assert_allclose(got["logits"], hidden[k][2] * N, rtol=1e-6)
        # layer 1 on the reference's stream and (decode) the reference's previous present as past
        past1 = refs[k - 1]["present.1.key"] if k else np.zeros((1, 0), np.float32)
        np.testing.assert_allclose(got["present.1.key"], np.concatenate([past1, hidden[k][1] * W1], 1), rtol=1e-6)
        np.testing.assert_allclose(got["layer_output.1"], hidden[k][1] * W1, rtol=1e-6)
        # layer 0: on the prologue's own h0 (the chained one), decode past from the reference
        past0 = refs[k - 1]["present.0.key"] if k else np.zeros((1, 0), np.float32)
        a0 = chained[k]["present.0.key"][:, -4:]
        np.testing.assert_allclose(got["present.0.key"], np.concatenate([past0, a0], 1), rtol=1e-6)
        np.testing.assert_allclose(got["layer_output.0"], np.maximum(a0, 0), rtol=1e-6)
        # the chained outputs are untouched by the reference-fed runs
        for name in chained[k]:
            np.testing.assert_allclose(run.outputs[k][name], chained[k][name], rtol=1e-6)
        np.testing.assert_allclose(run.outputs[k]["psum"], (refs[k - 1]["present.1.key"] if k else past1[:, :0]).sum())


def test_a_layer_whose_stream_is_ambiguous_is_refused():
    """Layer 1 reading two float values of the stream's shape from layer 0: which one is the stream?"""
    from onnx import helper

    proto = _graph()
    g = proto.graph
    at = [n.name for n in g.node].index("/model/layers.0/Relu")
    g.node.insert(at + 1, helper.make_node("Neg", ["h1"], ["h1n"], name="/model/layers.0/Neg"))
    at = [n.name for n in g.node].index("/model/layers.1/Identity")
    g.node.insert(at + 1, helper.make_node("Add", ["h1n", "a1"], ["h2b"], name="/model/layers.1/Add"))
    g.output.append(helper.make_tensor_value_info("h2b", 1, None))
    hidden = [[np.zeros((1, 4), np.float32)] * 3 for _ in range(3)]
    with pytest.raises(ValueError, match=r"^layer 1: .*residual stream.*\['h1', 'h1n'\]"):
        run_sliced(proto, _session, _feeds(), _whole(_graph(), _feeds()), reference_hidden=hidden)


# -- the description
def test_describe_names_the_largest_slice_and_what_was_borrowed():
    run = SlicedRun(outputs=[], slices=[("prologue", 3, 2**20), ("layer 0", 9, 3 * 2**20 + 2**19),
                                        ("head", 2, 2**21)])
    assert run.describe() == ("ONNX Runtime ran the graph in 3 slices (prologue, one per layer, head), one session "
                              "at a time; the largest held 3.5 MiB of weights (layer 0)")
    run.borrowed = {"past_key_values.3.key": False, "past_key_values.3.value": True}
    assert run.describe().startswith("ONNX Runtime ran the graph in 3 slices")
    assert run.describe().endswith("; 2 later-layer past inputs read by earlier slices were fed the reference's "
                                   "present of the same shape (READ AS DATA: not the whole graph's run)")
    run.borrowed = {"past_key_values.3.key": False}
    assert run.describe().endswith("; 1 later-layer past inputs read by earlier slices were fed the reference's "
                                   "present of the same shape (read only for their Shape)")


def test_weight_bytes_follow_the_initializers_dtype():
    from onnx import numpy_helper

    from wide_export.verify.slices import _tensor_bytes

    assert _tensor_bytes(numpy_helper.from_array(np.zeros((3, 5), np.float16))) == 30
    assert _tensor_bytes(numpy_helper.from_array(np.zeros((2,), np.int64))) == 16
    assert _tensor_bytes(numpy_helper.from_array(np.array(1.0, np.float32))) == 4
    assert isinstance(Slice("head", [], [], [], []).weight_bytes, int)


def test_one_step_only():
    proto = _graph()
    feeds = _feeds()[:1]
    run = run_sliced(proto, _session, feeds, [{}])
    hand = _by_hand(1)
    assert len(run.outputs) == 1 and run.borrowed == {}
    for name in hand[0]:
        np.testing.assert_allclose(run.outputs[0][name], hand[0][name], rtol=1e-6)


def test_a_past_read_as_data_by_one_slice_stays_so_when_a_later_slice_reads_only_its_shape():
    proto = _graph(layer0_shape_read=True)
    run = run_sliced(proto, _session, _feeds(), _whole(_graph(), _feeds()))
    assert run.borrowed == {"past_key_values.1.key": True}
    shape_only = run_sliced(_graph(past_read="Shape", layer0_shape_read=True), _session, _feeds(),
                            _whole(_graph(), _feeds()))
    assert shape_only.borrowed == {"past_key_values.1.key": False}


def test_progress_and_slices_count_weights_in_mib():
    said = []
    proto = _graph(big=True)
    run = run_sliced(proto, _session, _feeds()[:1], [{}], progress=said.append)
    assert said[0] == "slice 1/4: prologue (3 MiB of weights)"
    assert run.slices[0] == ("prologue", 5, 3 * 2**20 + 20)
    assert "the largest held 3.0 MiB of weights (prologue)" in run.describe()
