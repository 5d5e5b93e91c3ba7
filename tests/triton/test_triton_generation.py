"""The generated model.py outside Triton: decode loop vs a numpy full-recompute reference,
request validation, sampling."""

from __future__ import annotations

import numpy as np
import pytest

from tests.triton import tiny_llm


def test_batched_left_padded_greedy_matches_full_recompute(gm, runner, tiny, rng):
    settings, step = runner
    lengths = rng.permutation([1, 3, 6, 9])  # different lengths: left padding is exercised
    news = rng.integers(1, 8, size=4)
    rows = [gm.Row(rng.integers(0, tiny_llm.VOCAB, size=n), int(m)) for n, m in zip(lengths, news)]
    out = gm.generate(step, settings, rows)
    for row, got in zip(rows, out):
        want = tiny_llm.reference_greedy(tiny[1], row.prompt, row.max_new_tokens)
        np.testing.assert_array_equal(got, want)


def test_rows_too_long_to_pad_together_are_split(gm, runner, tiny, rng):
    settings, step = runner
    widths = []

    def watched(feeds, phase):
        widths.append(feeds["attention_mask"].shape[1])
        return step(feeds, phase)

    # Each row fits the limit alone; padded into one batch they would not.
    shapes = [(tiny_llm.MAX_POS - 2, 2), (2, tiny_llm.MAX_POS - 3), (3, 4)]
    rows = [gm.Row(rng.integers(0, tiny_llm.VOCAB, size=n), m) for n, m in shapes]
    out = gm.generate(watched, settings, rows)
    assert max(widths) <= tiny_llm.MAX_POS
    for row, got in zip(rows, out):
        np.testing.assert_array_equal(got, tiny_llm.reference_greedy(tiny[1], row.prompt, row.max_new_tokens))


@pytest.mark.parametrize(
    "prompt_len, new, extra, message",
    [
        (0, 4, {}, "empty"),
        (5, 0, {}, "max_new_tokens"),
        (5, -3, {}, "max_new_tokens"),
        (tiny_llm.MAX_POS, 1, {}, "exceeds"),
        (5, 4, {"temperature": -1.0}, "temperature"),
        (5, 4, {"top_p": 0.0}, "top_p"),
        (5, 4, {"top_p": 1.5}, "top_p"),
    ],
)
def test_validation_rejects(gm, runner, prompt_len, new, extra, message, rng):
    settings, _ = runner
    row = gm.Row(rng.integers(0, tiny_llm.VOCAB, size=prompt_len), new, **extra)
    with pytest.raises(gm.RequestError, match=message):
        gm.validate_row(row, settings)


@pytest.mark.parametrize("bad", [-1, tiny_llm.VOCAB])
def test_validation_rejects_out_of_vocab(gm, runner, bad, rng):
    settings, _ = runner
    prompt = rng.integers(0, tiny_llm.VOCAB, size=4)
    prompt[2] = bad
    with pytest.raises(gm.RequestError, match="input_ids must lie"):
        gm.validate_row(gm.Row(prompt, 2), settings)


def test_validation_accepts_the_limit(gm, runner):
    settings, _ = runner
    gm.validate_row(gm.Row(np.zeros(tiny_llm.MAX_POS - 3, np.int64) + 1, 3), settings)


def test_sampling_is_seeded_and_tiny_top_p_is_greedy(gm, runner, rng):
    settings, step = runner
    prompt = rng.integers(0, tiny_llm.VOCAB, size=5)
    greedy = gm.generate(step, settings, [gm.Row(prompt, 12)])[0]
    hot = [gm.Row(prompt, 12, temperature=5.0, seed=s) for s in (7, 7, 8)]
    a, b, c = gm.generate(step, settings, hot)
    np.testing.assert_array_equal(a, b)  # same seed, same tokens (even in one batch)
    assert not np.array_equal(a, c) or not np.array_equal(a, greedy)  # a high temperature does sample
    nucleus = gm.generate(step, settings, [gm.Row(prompt, 12, temperature=1.0, top_p=1e-6, seed=3)])[0]
    np.testing.assert_array_equal(nucleus, greedy)  # top_p -> 0 keeps only the argmax


def test_choose_tokens_top_p_keeps_the_nucleus(gm):
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]]))
    seen = set()
    rngs = [np.random.default_rng(s) for s in range(1)]
    for _ in range(300):
        seen.add(int(gm.choose_tokens(logits, [gm.Row(np.ones(1), 1, temperature=1.0, top_p=0.7)], rngs)[0]))
    assert seen == {0, 1}  # 0.5 < 0.7 <= 0.8: the two most likely tokens only


# -- Triton requests in and responses out (fake pb_utils; the tiny model in ONNX Runtime)
import json  # noqa: E402
from types import SimpleNamespace  # noqa: E402

from tests.triton import fake_pb_utils  # noqa: E402


class _Error:
    """pb_utils.TritonError with the error codes of newer Tritons."""

    INVALID_ARG = "INVALID_ARG"

    def __init__(self, message, code=None):
        self._message, self.code = message, code

    def message(self):
        return self._message


class _Request:
    """A Triton request: its inputs by name (numpy), what it asked for, its parameters, its sender."""

    def __init__(self, wanted=None, parameters=None, sender=None, **inputs):
        self.inputs = {name: fake_pb_utils.Tensor(name, np.asarray(v)) for name, v in inputs.items()}
        self._wanted, self._parameters, self.sender = wanted, parameters, sender

    def requested_output_names(self):
        return list(self._wanted or [])

    def parameters(self):
        return self._parameters

    def get_response_sender(self):
        return self.sender


class _Sender:
    def __init__(self):
        self.sent = []  # (response or None, flags)

    def send(self, response=None, flags=0):
        self.sent.append((response, flags))


def _fake_pb(decoupled=False, error=_Error):
    return SimpleNamespace(
        Tensor=fake_pb_utils.Tensor, TritonError=error, InferenceResponse=fake_pb_utils.InferenceResponse,
        TRITONSERVER_RESPONSE_COMPLETE_FINAL=1, Logger=None,
        get_input_tensor_by_name=lambda request, name: request.inputs.get(name),
        using_decoupled_model_transaction_policy=lambda config: decoupled)


@pytest.fixture
def pb(gm, monkeypatch):
    fake = _fake_pb()
    monkeypatch.setattr(gm, "pb_utils", fake)
    return fake


def _out(response, name):
    return next(t for t in response.output_tensors if t.name() == name).as_numpy()


def _ids(*rows):
    return np.array(rows, dtype=np.int64)


def test_rows_from_a_request_take_each_input_per_row_or_broadcast(gm, runner, pb):
    """Per-row [b, 1] inputs, one row broadcast to all, stop ids = eos (unless ignore_eos) + the request's."""
    import dataclasses

    settings = dataclasses.replace(runner[0], eos_token_ids=[2, 5])
    request = _Request(input_ids=_ids([1, 2, 3], [4, 5, 6]), max_new_tokens=np.array([[4], [6]], np.int32),
                       temperature=np.array([[0.5]], np.float32), top_p=np.array([[0.25], [1.0]], np.float32),
                       seed=np.array([[7], [9]], np.int64), ignore_eos=np.array([[False], [True]]),
                       stop_token_ids=np.array([[11, 12]], np.int64))
    rows = gm.rows_from_request(request, settings)
    assert [r.prompt.tolist() for r in rows] == [[1, 2, 3], [4, 5, 6]]
    assert [r.prompt.dtype for r in rows] == [np.int64, np.int64]
    assert [(r.max_new_tokens, r.temperature, r.top_p, r.seed) for r in rows] == [(4, 0.5, 0.25, 7),
                                                                                   (6, 0.5, 1.0, 9)]
    assert [r.stop_ids for r in rows] == [(2, 5, 11, 12), (11, 12)]
    assert [r.stop_strings for r in rows] == [(), ()]
    assert all(type(r.max_new_tokens) is int and type(r.seed) is int for r in rows)


def test_rows_from_a_request_defaults(gm, runner, pb):
    """Absent inputs: the rest of the context (never negative), greedy, top_p 1, unseeded, eos only."""
    settings = runner[0]
    rows = gm.rows_from_request(_Request(input_ids=_ids([1, 2, 3])), settings)
    assert [(r.max_new_tokens, r.temperature, r.top_p, r.seed, r.stop_ids) for r in rows] == [
        (settings.max_total_tokens - 3, 0.0, 1.0, None, tuple(settings.eos_token_ids))]
    long = np.ones((1, settings.max_total_tokens + 2), np.int64)
    assert gm.rows_from_request(_Request(input_ids=long), settings)[0].max_new_tokens == 0
    assert gm.rows_from_request(_Request(input_ids=_ids([1, 2])))[0].max_new_tokens == 0  # no settings: no limit
    assert gm.rows_from_request(_Request(input_ids=_ids([1, 2])))[0].stop_ids == ()
    # a scalar stop_token_ids is one id for every row
    rows = gm.rows_from_request(_Request(input_ids=_ids([1], [2]), stop_token_ids=np.array(9, np.int64)))
    assert [r.stop_ids for r in rows] == [(9,), (9,)]


@pytest.mark.parametrize("inputs, facts", [  # what each refusal must name
    ({}, ("exactly one of input_ids", "text_input")),
    ({"input_ids": _ids([1]), "text_input": np.array([b"hi"], np.object_)}, ("exactly one of input_ids", "text_input")),
    ({"input_ids": np.array([1, 2, 3], np.int64)}, ("input_ids ", "[batch, tokens]", "shape [3]")),
    ({"text_input": np.array([b"hi"], np.object_)}, ("no tokenizer (tokenizer.json)", "send input_ids")),
    ({"input_ids": _ids([1], [2]), "temperature": np.ones((3, 1), np.float32)}, ("temperature ", "batch 3", " 2")),
    ({"input_ids": _ids([1], [2], [3]), "stop_token_ids": np.ones((2, 1), np.int64)},
     ("stop_token_ids ", "batch 2", " 3")),
    ({"input_ids": _ids([1]), "stop_words": np.array([[b"end"]], np.object_)}, ("stop_words ", "(tokenizer.json)")),
])
def test_malformed_requests_are_refused_with_what_to_send(gm, runner, pb, inputs, facts):
    with pytest.raises(gm.RequestError) as err:
        gm.rows_from_request(_Request(**inputs), runner[0])
    assert all(fact in str(err.value) for fact in facts), str(err.value)


def test_empty_stop_words_need_no_tokenizer(gm, runner, pb):
    rows = gm.rows_from_request(_Request(input_ids=_ids([1]), stop_words=np.array([[b""]], np.object_)), runner[0])
    assert rows[0].stop_strings == ()


@pytest.fixture(scope="module")
def codec(gm, tmp_path_factory):
    """The demo's byte-level tokenizer, through textgen's Codec."""
    from wide_export.model.demo_tokenizer import write_demo_tokenizer

    folder = tmp_path_factory.mktemp("tok")
    write_demo_tokenizer(folder)
    return gm.load_sibling("textgen").load_codec(str(folder))


def test_text_prompts_go_through_the_tokenizer(gm, runner, pb, codec):
    """text_input rows are the tokenizers library's own encoding, with or without special tokens as asked;
    stop words are decoded from UTF-8 and empty ones dropped."""
    texts = np.array([["héllo world".encode()], ["a b".encode()]], np.object_)
    request = _Request(text_input=texts, add_special_tokens=np.array([[True], [False]]),
                       stop_words=np.array([["wörld".encode(), b""]], np.object_))
    rows = gm.rows_from_request(request, runner[0], codec)
    tok = codec.tokenizer
    assert rows[0].prompt.tolist() == tok.encode("héllo world", add_special_tokens=True).ids
    assert rows[1].prompt.tolist() == tok.encode("a b", add_special_tokens=False).ids
    assert [r.stop_strings for r in rows] == [("wörld",), ("wörld",)]
    default = gm.rows_from_request(_Request(text_input=np.array([[b"a b"]], np.object_)), runner[0], codec)
    assert default[0].prompt.tolist() == tok.encode("a b", add_special_tokens=True).ids
    with pytest.raises(gm.RequestError, match="^text_input .*UTF-8"):
        gm.rows_from_request(_Request(text_input=np.array([[b"\xff\xfe"]], np.object_)), runner[0], codec)
    with pytest.raises(gm.RequestError, match="^stop_words .*UTF-8"):
        gm.rows_from_request(_Request(input_ids=_ids([1]), stop_words=np.array([[b"\xff"]], np.object_)),
                             runner[0], codec)


def test_response_tensors_hold_what_was_asked(gm, pb):
    textgen = gm.load_sibling("textgen")
    a = textgen.RowOutput(np.ones(3, np.int64), 2)
    b = textgen.RowOutput(np.ones(5, np.int64), 4, stop_ids=(8,))
    a.add(1), a.add(2), b.add(8)  # a: length after 2; b: a stop token
    tokens = gm.padded_tokens([a, b], pad=0)
    assert tokens.tolist() == [[1, 2], [8, 0]]
    every = gm.response_tensors([a, b], tokens, set(gm.C.OUTPUT_NAMES), ["xy", "é"])
    got = {t.name(): t.as_numpy() for t in every}
    assert list(got) == ["output_ids", "text_output", "finish_reason", "num_input_tokens", "num_output_tokens"]
    assert got["output_ids"].dtype == np.int64 and got["output_ids"].tolist() == [[1, 2], [8, 0]]
    assert got["text_output"].tolist() == [[b"xy"], ["é".encode()]]
    assert got["finish_reason"].tolist() == [[b"length"], [b"stop"]]
    assert got["num_input_tokens"].dtype == np.int32 and got["num_input_tokens"].tolist() == [[3], [5]]
    assert got["num_output_tokens"].dtype == np.int32 and got["num_output_tokens"].tolist() == [[2], [1]]
    only = gm.response_tensors([a, b], tokens, {"output_ids"}, ["", ""])
    assert [t.name() for t in only] == ["output_ids"]  # output_ids always; the rest only when asked
    running = textgen.RowOutput(np.ones(1, np.int64), 5)
    running.add(3)
    assert gm.response_tensors([running], np.array([[3]]), {"finish_reason"}, [""])[1].as_numpy().tolist() == [[b""]]


def test_wanted_outputs_probe_and_finish_reason(gm, pb):
    assert gm._wanted(_Request(wanted=["text_output"])) == {"text_output"}
    assert gm._wanted(_Request()) == set(gm.C.OUTPUT_NAMES)  # none named: all
    assert gm._wanted(SimpleNamespace()) == set(gm.C.OUTPUT_NAMES)
    assert gm._is_probe(_Request(parameters='{"wide_probe": true}')) is True
    for parameters in ('{"wide_probe": false}', "{}", "", None, "not json", "[1]"):
        assert gm._is_probe(_Request(parameters=parameters)) is False
    assert gm._is_probe(SimpleNamespace(parameters="x")) is False  # not callable
    textgen = gm.load_sibling("textgen")
    stop, length = textgen.RowOutput(np.ones(1), 3, stop_ids=(1,)), textgen.RowOutput(np.ones(1), 1)
    stop.add(1), length.add(4)
    assert gm.finish_reason([stop]) == "stop" and gm.finish_reason([stop, length]) == "length"


def test_invalid_argument_uses_the_code_where_triton_has_one(gm, monkeypatch):
    monkeypatch.setattr(gm, "pb_utils", _fake_pb())
    err = gm._invalid_argument("bad")
    assert (err.message(), err.code) == ("bad", "INVALID_ARG")

    class Old:
        def __init__(self, message):
            self._message = message

    monkeypatch.setattr(gm, "pb_utils", _fake_pb(error=Old))
    assert gm._invalid_argument("bad")._message == "bad"


def _initialized(gm, tiny_repo, monkeypatch, decoupled=False, batching=None):
    monkeypatch.setattr(gm, "pb_utils", _fake_pb(decoupled=decoupled))
    parameters = {"intra_op_threads": {"string_value": "1"}}
    if batching:
        parameters["batching"] = {"string_value": batching}
    model = gm.TritonPythonModel()
    model.initialize({"model_config": json.dumps({"name": "wide_llm", "max_batch_size": 4,
                                                  "parameters": parameters}),
                      "model_repository": str(tiny_repo / "wide_llm"), "model_version": "1"})
    return model


def test_execute_answers_each_request_in_order(gm, tiny_repo, tiny, monkeypatch):
    """Static batching: a malformed request gets its INVALID_ARG error, the others their greedy tokens
    (the numpy reference), padded with pad_token_id, with counts and finish reasons."""
    model = _initialized(gm, tiny_repo, monkeypatch)
    assert model.streaming is False and model.scheduler is None
    prompts = _ids([3, 1, 4, 1], [5, 9, 2, 6])
    good = _Request(input_ids=prompts, max_new_tokens=np.array([[3], [5]], np.int32))
    bad = _Request(input_ids=_ids([1]), max_new_tokens=np.array([[0]], np.int32))
    third = _Request(input_ids=_ids([7, 7]), max_new_tokens=np.array([[2]], np.int32), wanted=["output_ids"])
    responses = model.execute([bad, good, third])
    said = responses[0].error().message() if responses[0].has_error() else ""
    assert said.startswith("max_new_tokens ") and said.endswith("got 0"), said
    assert responses[0].error().code == "INVALID_ARG"
    ids = _out(responses[1], "output_ids")
    assert ids.shape == (2, 5)
    np.testing.assert_array_equal(ids[0, :3], tiny_llm.reference_greedy(tiny[1], prompts[0], 3))
    assert ids[0, 3:].tolist() == [model.settings.pad_token_id] * 2
    np.testing.assert_array_equal(ids[1], tiny_llm.reference_greedy(tiny[1], prompts[1], 5))
    assert _out(responses[1], "num_input_tokens").tolist() == [[4], [4]]
    assert _out(responses[1], "num_output_tokens").tolist() == [[3], [5]]
    assert _out(responses[1], "finish_reason").tolist() == [[b"length"], [b"length"]]
    assert [t.name() for t in responses[2].output_tensors] == ["output_ids"]
    np.testing.assert_array_equal(_out(responses[2], "output_ids")[0], tiny_llm.reference_greedy(tiny[1], [7, 7], 2))


def test_a_failing_generation_is_reported_to_every_request(gm, tiny_repo, monkeypatch):
    model = _initialized(gm, tiny_repo, monkeypatch)

    def broken(feeds, phase):
        raise RuntimeError("device lost")

    model.step = broken
    requests = [_Request(input_ids=_ids([1, 2]), max_new_tokens=np.array([[2]], np.int32)) for _ in range(2)]
    responses = model.execute(requests)
    assert [r.error().message() for r in responses] == ["generation failed: device lost"] * 2


def test_static_streaming_sends_a_token_per_response_then_the_final_flag(gm, tiny_repo, tiny, monkeypatch):
    model = _initialized(gm, tiny_repo, monkeypatch, decoupled=True)
    assert model.streaming is True and model.scheduler is None  # no `batching` parameter: static
    senders = [_Sender(), _Sender(), _Sender()]
    prompt = [2, 7, 1]
    requests = [_Request(input_ids=_ids(prompt), max_new_tokens=np.array([[3]], np.int32), sender=senders[0]),
                _Request(input_ids=_ids([1]), max_new_tokens=np.array([[-1]], np.int32), sender=senders[1]),
                _Request(input_ids=_ids([4, 4]), max_new_tokens=np.array([[1]], np.int32), sender=senders[2],
                         wanted=["output_ids", "finish_reason"])]
    assert model.execute(requests) is None
    want = tiny_llm.reference_greedy(tiny[1], np.array(prompt), 3)
    first = senders[0].sent
    assert [int(_out(r, "output_ids")[0, 0]) for r, _ in first[:-1]] == list(want)
    assert [f for _, f in first] == [0, 0, 0, 1] and first[-1][0] is None
    assert [_out(r, "finish_reason").tolist() for r, _ in first[:-1]] == [[[b""]], [[b""]], [[b"length"]]]
    assert [_out(r, "num_output_tokens").tolist() for r, _ in first[:-1]] == [[[1]], [[2]], [[3]]]
    (error, flags), = senders[1].sent
    said = error.error().message()
    assert flags == 1 and said.startswith("max_new_tokens ") and said.endswith("got -1"), said
    third = senders[2].sent
    assert [f for _, f in third] == [0, 1]
    assert [t.name() for t in third[0][0].output_tensors] == ["output_ids", "finish_reason"]


def test_inflight_streaming_is_set_up_by_the_batching_parameter(gm, tiny_repo, tiny, monkeypatch):
    model = _initialized(gm, tiny_repo, monkeypatch, decoupled=True, batching="inflight")
    try:
        assert model.scheduler is not None
        sender = _Sender()
        import threading

        done = threading.Event()
        original = sender.send

        def send(response=None, flags=0):
            original(response, flags)
            if flags & 1:
                done.set()

        sender.send = send
        prompt = [6, 1, 8]
        assert model.execute([_Request(input_ids=_ids(prompt), max_new_tokens=np.array([[4]], np.int32),
                                       sender=sender)]) is None
        assert done.wait(120)
        tokens = [int(_out(r, "output_ids")[0, 0]) for r, _ in sender.sent if r is not None]
        np.testing.assert_array_equal(tokens, tiny_llm.reference_greedy(tiny[1], np.array(prompt), 4))
    finally:
        model.finalize()
    static = _initialized(gm, tiny_repo, monkeypatch, decoupled=False, batching="inflight")
    assert static.scheduler is None  # in-flight batching is for streaming repositories only
