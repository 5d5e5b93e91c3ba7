"""The generation model's Triton entry point on fakes: what initialize() sets up from the model
config and generation.json, what execute() reports to the metrics in each mode, what a streaming
client that leaves or a failing generation gets, and the small device helpers (check_device_cache_ops,
_bind_torch_input, ort_step's options, _log, load_sibling).

Every fake records its calls; expectations are written out by hand (the tiny contract model's
greedy tokens come from tests/triton/tiny_llm.py's numpy reference).
"""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import numpy as np
import pytest

from tests.triton import fake_pb_utils, tiny_llm

FINAL = 1


class _Family:
    """pb_utils.MetricFamily: records every metric's calls in `log` as (family, labels, call, value)."""

    HISTOGRAM, COUNTER, GAUGE = "histogram", "counter", "gauge"
    log: list = []

    def __init__(self, name, description, kind):
        self.name, self.kind = name, kind

    def Metric(self, labels, buckets=None):  # noqa: N802 - pb_utils' spelling
        family, log = self.name, _Family.log

        class _Metric:
            def observe(self, value):
                log.append((family, labels, "observe", value))

            def increment(self, value):
                log.append((family, labels, "increment", value))

            def set(self, value):
                log.append((family, labels, "set", value))

        return _Metric()


def _pb(decoupled=False, logger=None):
    _Family.log = []
    return SimpleNamespace(
        Tensor=fake_pb_utils.Tensor, TritonError=fake_pb_utils.TritonError,
        InferenceResponse=fake_pb_utils.InferenceResponse, TRITONSERVER_RESPONSE_COMPLETE_FINAL=FINAL,
        MetricFamily=_Family, Logger=logger,
        get_input_tensor_by_name=lambda request, name: request.inputs.get(name),
        using_decoupled_model_transaction_policy=lambda config: decoupled)


def _calls(family: str, call: str | None = None) -> list:
    """The values `family` (without the wide: prefix) was given, in order."""
    return [value for name, _, kind, value in _Family.log if name == "wide:" + family and call in (None, kind)]


class _Request:
    def __init__(self, prompt=None, new=None, sender=None, probe=False, wanted=None, **inputs):
        if prompt is not None:
            inputs["input_ids"] = np.asarray(prompt, np.int64).reshape(1, -1) if np.ndim(prompt) == 1 else prompt
        if new is not None:
            inputs["max_new_tokens"] = np.full((1, 1), new, np.int32)
        self.inputs = {k: fake_pb_utils.Tensor(k, np.asarray(v)) for k, v in inputs.items()}
        self.sender, self._probe, self._wanted = sender, probe, wanted

    def get_response_sender(self):
        return self.sender

    def requested_output_names(self):
        return list(self._wanted or [])

    def parameters(self):
        return json.dumps({"wide_probe": True}) if self._probe else "{}"


class _Sender:
    """A decoupled sender; `leave_after`: send() raises after that many token responses (a closed
    stream), `cancel_after`: is_cancelled() turns true after that many."""

    def __init__(self, leave_after=None, cancel_after=None):
        self.leave_after, self.cancel_after = leave_after, cancel_after
        self.sent: list = []  # (response or None, flags)

    def _tokens_sent(self):
        return sum(1 for r, _ in self.sent if r is not None and not r.has_error())

    def is_cancelled(self):
        return self.cancel_after is not None and self._tokens_sent() >= self.cancel_after

    def send(self, response=None, flags=0):
        if self.leave_after is not None and response is not None and self._tokens_sent() >= self.leave_after:
            raise RuntimeError("stream closed")
        self.sent.append((response, flags))

    def tokens(self):
        return [int(_out(r, "output_ids")[0, 0]) for r, _ in self.sent if r is not None and not r.has_error()]


def _out(response, name):
    return next(t for t in response.output_tensors if t.name() == name).as_numpy()


def _args(tiny_repo, name="wide_llm", max_batch_size=4, parameters=None, args_name=None):
    config = {"max_batch_size": max_batch_size, "parameters": parameters or {}}
    if name is not None:
        config["name"] = name
    args = {"model_config": json.dumps(config), "model_repository": str(tiny_repo / "wide_llm"), "model_version": "1"}
    if args_name is not None:
        args["model_name"] = args_name
    return args


def _model(gm, monkeypatch, tiny_repo, decoupled=False, logger=None, **config):
    monkeypatch.setattr(gm, "pb_utils", _pb(decoupled, logger))
    model = gm.TritonPythonModel()
    model.initialize(_args(tiny_repo, **config))
    _Family.log.clear()  # only what requests do
    return model


# ---------------------------------------------------------------------------------------------------
# initialize(): from the model config and generation.json


@pytest.mark.parametrize("name, args_name, label", [("wide_llm", None, "wide_llm"), (None, "from_args", "from_args"),
                                                     (None, None, "")])
def test_metrics_are_labelled_with_the_models_name(gm, tiny_repo, monkeypatch, name, args_name, label):
    monkeypatch.setattr(gm, "pb_utils", _pb())
    model = gm.TritonPythonModel()
    model.initialize(_args(tiny_repo, name=name, args_name=args_name))
    assert _Family.log == []  # creating the metrics calls nothing on them
    model.metrics.gauges(3, 1)
    assert _Family.log == [("wide:num_requests_running", {"model_name": label}, "set", 3),
                           ("wide:num_requests_waiting", {"model_name": label}, "set", 1)]


def test_initialize_passes_intra_op_threads_to_onnxruntime(gm, tiny_repo, monkeypatch):
    seen = []
    monkeypatch.setattr(gm, "ort_step", lambda folder, settings, threads=0: seen.append((folder, threads)) or "s")
    monkeypatch.setattr(gm, "pb_utils", _pb())
    for parameters, threads in (({"intra_op_threads": {"string_value": "3"}}, 3), ({}, 0)):
        model = gm.TritonPythonModel()
        model.initialize(_args(tiny_repo, parameters=parameters))
        assert model.step == "s"
        assert seen.pop() == (str(tiny_repo / "wide_llm" / "1"), threads)
    assert type(threads) is int


def test_initialize_picks_the_step_by_flavour(gm, tiny_repo, monkeypatch, tmp_path):
    import shutil

    repo = tmp_path / "repo"
    shutil.copytree(tiny_repo, repo)
    path = repo / "wide_llm" / "1" / "generation.json"
    settings = json.loads(path.read_text())
    monkeypatch.setattr(gm, "bls_step", lambda s: ("bls", s.engine_model))
    monkeypatch.setattr(gm, "pb_utils", _pb())
    path.write_text(json.dumps({**settings, "flavour": "tensorrt", "engine_model": "wide_llm_engine"}))
    model = gm.TritonPythonModel()
    model.initialize(_args(repo))
    assert model.step == ("bls", "wide_llm_engine") and model.settings.flavour == "tensorrt"
    path.write_text(json.dumps({**settings, "flavour": "tensorflow"}))
    with pytest.raises(ValueError, match="'tensorflow'.*generation.json"):
        gm.TritonPythonModel().initialize(_args(repo))


@pytest.mark.parametrize("max_batch_size, rows", [(4, 4), (0, 1), (1, 1)])
def test_inflight_batching_gets_max_batch_size_rows_and_the_device_check(gm, tiny_repo, monkeypatch,
                                                                         max_batch_size, rows):
    made = SimpleNamespace(batch=None, checked=None, observe=None, started=0)

    class Batch:
        def __init__(self, step, settings, choose, max_rows):
            made.batch = (step, settings, choose, max_rows)

    class Scheduler:
        def __init__(self, batch, log, observe=None):
            made.log, made.observe = log, observe

        def start(self):
            made.started += 1
            return self

    fake = SimpleNamespace(Batch=Batch, Scheduler=Scheduler)
    monkeypatch.setattr(gm, "load_decoding", lambda: fake)
    monkeypatch.setattr(gm, "check_device_cache_ops", lambda s, step, inflight: setattr(made, "checked", inflight))
    model = _model(gm, monkeypatch, tiny_repo, decoupled=True, max_batch_size=max_batch_size,
                   parameters={"batching": {"string_value": "inflight"}})
    assert isinstance(model.scheduler, Scheduler) and made.started == 1 and made.checked is fake
    step, settings, choose, max_rows = made.batch
    assert (step, settings, choose, max_rows) == (model.step, model.settings, gm.choose_tokens, rows)
    assert made.log is gm._log and made.observe == model.metrics.gauges
    for decoupled, parameters in ((True, {"batching": {"string_value": "static"}}), (True, {}),
                                  (False, {"batching": {"string_value": "inflight"}})):
        made.started, made.checked = 0, None
        other = _model(gm, monkeypatch, tiny_repo, decoupled=decoupled, parameters=parameters)
        assert other.scheduler is None and made.started == 0 and other.streaming is decoupled
        assert made.checked is fake  # static batching rebuilds the cache too: checked at load
        other.finalize()  # nothing to stop


def test_finalize_stops_the_scheduler(gm):
    model = gm.TritonPythonModel()
    stopped = []
    model.scheduler = SimpleNamespace(stop=lambda: stopped.append(1))
    model.finalize()
    assert stopped == [1]


# ---------------------------------------------------------------------------------------------------
# execute(), static batching: metrics


def test_static_execute_reports_gauges_timer_and_counts(gm, tiny_repo, tiny, monkeypatch):
    model = _model(gm, monkeypatch, tiny_repo)
    clock = iter(range(100, 200))
    metrics = gm.load_sibling("metrics")
    model.timer = (lambda request, original=model.timer:
                   metrics.RequestTimer(original(request).metrics, clock=lambda: float(next(clock))))
    gauges = []
    model.metrics.gauges = lambda running, waiting: gauges.append((running, waiting))
    two = np.array([[3, 1, 4], [1, 5, 9]], np.int64)
    requests = [_Request(two, 3), _Request([2, 6], 0), _Request([5, 3, 5, 8], 2)]
    responses = model.execute(requests)
    # After each step the rows still decoding: the 2-token row left after its second token, then none.
    assert gauges == [(2, 0), (0, 0)]
    said = responses[1].error().message()
    assert said.startswith("max_new_tokens ") and said.endswith("got 0"), said
    np.testing.assert_array_equal(_out(responses[0], "output_ids")[1], tiny_llm.reference_greedy(tiny[1], two[1], 3))
    # each valid request: admitted, one token response, finished (in the order they end) with its reason and counts
    assert _calls("request_prompt_tokens") == [4, 6]
    assert _calls("request_generation_tokens") == [2, 6]
    assert _calls("prompt_tokens_total") == [4, 6] and _calls("generation_tokens_total") == [2, 6]
    assert [labels["finished_reason"] for n, labels, _, _ in _Family.log
            if n == "wide:request_success_total"] == ["length", "length"]
    assert len(_calls("request_queue_time_seconds")) == 2 and len(_calls("time_to_first_token_seconds")) == 2
    assert _calls("inter_token_latency_seconds") == []  # one response per request: no gap between tokens


def test_probes_stay_out_of_the_llm_metrics(gm, tiny_repo, monkeypatch):
    model = _model(gm, monkeypatch, tiny_repo)
    model.metrics.gauges = lambda running, waiting: None
    response, = model.execute([_Request([1, 2], 1, probe=True)])
    assert not response.has_error() and _Family.log == []
    model.execute([_Request([1, 2], 1)])
    assert _calls("request_prompt_tokens") == [2]


def test_a_failing_generation_resets_the_gauges_and_answers_only_the_valid_requests(gm, tiny_repo, monkeypatch):
    model = _model(gm, monkeypatch, tiny_repo)
    gauges = []
    model.metrics.gauges = lambda running, waiting: gauges.append((running, waiting))

    def broken(feeds, phase):
        raise RuntimeError("out of memory")

    model.step = broken
    responses = model.execute([_Request([1, 2], 2), _Request([1], 0), _Request([3], 1)])
    assert [r.error().message() for r in responses] == ["generation failed: out of memory",
                                                        "max_new_tokens must be >= 1, got 0",
                                                        "generation failed: out of memory"]
    assert gauges == [(0, 0)]  # the failed step left nobody decoding
    assert _calls("request_prompt_tokens") == []  # nothing finished


def test_only_malformed_requests_generate_nothing(gm, tiny_repo, monkeypatch):
    model = _model(gm, monkeypatch, tiny_repo)
    model.step = None  # never called
    gauges = []
    model.metrics.gauges = lambda running, waiting: gauges.append((running, waiting))
    responses = model.execute([_Request([1], 0), _Request(None, 2)])
    assert [r.error().message() for r in responses] == [
        "max_new_tokens must be >= 1, got 0", "send exactly one of input_ids (token ids) or text_input (text)"]
    assert gauges == []


# ---------------------------------------------------------------------------------------------------
# execute(), decoupled, static batching: clients that leave, failures, metrics


def test_a_streaming_client_that_leaves_stops_its_rows_and_the_others_go_on(gm, tiny_repo, tiny, monkeypatch):
    logged = []
    model = _model(gm, monkeypatch, tiny_repo, decoupled=True,
                   logger=SimpleNamespace(log_info=lambda m: logged.append(m)))
    calls = []
    step = model.step
    model.step = lambda feeds, phase: calls.append(phase) or step(feeds, phase)
    leaving, staying = _Sender(leave_after=2), _Sender()
    a, b = [4, 4, 2], [7, 1, 3]  # one length: generated together
    assert model.execute([_Request(a, 9, leaving), _Request(b, 5, staying)]) is None
    assert leaving.tokens() == list(tiny_llm.reference_greedy(tiny[1], np.array(a), 2))
    assert leaving.sent[-1] == (None, FINAL)  # its final flag, no error
    assert [f for _, f in leaving.sent] == [0, 0, FINAL]
    assert staying.tokens() == list(tiny_llm.reference_greedy(tiny[1], np.array(b), 5))
    assert [f for _, f in staying.sent] == [0] * 5 + [FINAL] and staying.sent[-1][0] is None
    assert len(logged) == 1 and logged[0].startswith("streaming client went away after 2 of 9 tokens; its rows ")
    assert calls == ["prefill"] + ["decode"] * 4  # 5 tokens for the one that stayed, not 9
    reasons = [labels["finished_reason"] for n, labels, _, _ in _Family.log if n == "wide:request_success_total"]
    assert reasons == ["abort", "length"]
    assert _calls("request_generation_tokens") == [3, 5]  # the third token was made, never delivered


def test_when_every_streaming_client_left_decoding_stops(gm, tiny_repo, monkeypatch):
    model = _model(gm, monkeypatch, tiny_repo, decoupled=True)
    calls = []
    step = model.step
    model.step = lambda feeds, phase: calls.append(phase) or step(feeds, phase)
    senders = [_Sender(cancel_after=1), _Sender(cancel_after=1)]
    model.execute([_Request([1, 2], 20, senders[0]), _Request([3, 4], 20, senders[1])])
    assert calls == ["prefill", "decode"]  # the token after the first found both gone
    for s in senders:
        assert len(s.tokens()) == 1 and s.sent[-1] == (None, FINAL)


def test_a_failing_streamed_generation_sends_the_error_as_the_final_response(gm, tiny_repo, monkeypatch):
    model = _model(gm, monkeypatch, tiny_repo, decoupled=True)
    gauges = []
    model.metrics.gauges = lambda running, waiting: gauges.append((running, waiting))
    step, calls = model.step, []

    def failing(feeds, phase):
        calls.append(phase)
        if len(calls) == 3:
            raise RuntimeError("engine lost")
        return step(feeds, phase)

    model.step = failing
    live, bad, left = _Sender(), _Sender(), _Sender(leave_after=1)
    model.execute([_Request([5, 6], 8, live), _Request([1], -2, bad), _Request([7, 8], 8, left)])
    assert len(live.tokens()) == 2
    last, flags = live.sent[-1]
    assert flags == FINAL and last.error().message().endswith(": engine lost")  # the step's error, carried
    assert left.sent[-1] == (None, FINAL)  # gone before the failure: no error for nobody
    (error, flags), = bad.sent
    said = error.error().message()
    assert flags == FINAL and said.startswith("max_new_tokens ") and said.endswith("got -2"), said
    assert gauges == [(1, 0), (0, 0)]  # the leaving client's row left at step 2; step 3 failed
    reasons = [labels["finished_reason"] for n, labels, _, _ in _Family.log if n == "wide:request_success_total"]
    assert sorted(reasons) == ["abort", "abort"]  # neither ran to its end


def test_streaming_with_only_malformed_requests_generates_nothing(gm, tiny_repo, monkeypatch):
    model = _model(gm, monkeypatch, tiny_repo, decoupled=True)
    model.step = None
    gauges = []
    model.metrics.gauges = lambda running, waiting: gauges.append((running, waiting))
    sender = _Sender()
    assert model.execute([_Request([1], 0, sender)]) is None
    assert len(sender.sent) == 1 and gauges == []


def test_streamed_rows_of_one_request_come_together_with_text_only_when_asked(gm, tiny_repo, tiny, monkeypatch):
    model = _model(gm, monkeypatch, tiny_repo, decoupled=True)
    two = np.array([[2, 3], [9, 9]], np.int64)
    sender = _Sender()
    model.execute([_Request(two, 2, sender, wanted=["output_ids"])])
    responses = [r for r, _ in sender.sent if r is not None]
    assert [_out(r, "output_ids").shape for r in responses] == [(2, 1), (2, 1)]
    want = [tiny_llm.reference_greedy(tiny[1], p, 2) for p in two]
    assert [_out(r, "output_ids")[:, 0].tolist() for r in responses] == [[w[0] for w in want], [w[1] for w in want]]
    assert [[t.name() for t in r.output_tensors] for r in responses] == [["output_ids"]] * 2


# ---------------------------------------------------------------------------------------------------
# execute(), in-flight batching: what a job's finish() reports


def test_inflight_finish_reports_abort_for_an_unfinished_request_and_forwards_errors(gm, tiny_repo, monkeypatch):
    model = _model(gm, monkeypatch, tiny_repo, decoupled=True)
    jobs = []
    model.scheduler = SimpleNamespace(submit=jobs.append)
    monkeypatch.setattr(gm, "load_decoding", lambda: SimpleNamespace(Job=lambda **kw: SimpleNamespace(**kw)))
    senders = [_Sender(), _Sender(), _Sender()]
    model.execute([_Request([1, 2], 3, senders[0]), _Request([1], 0, senders[1]), _Request([4], 1, senders[2])])
    assert len(jobs) == 2 and len(senders[1].sent) == 1  # the malformed one answered at once, never submitted
    first, third = jobs
    assert [r.prompt.tolist() for r in first.rows] == [[1, 2]] and first.rows[0].max_new_tokens == 3
    first.outputs[0].add(5)
    assert first.emit([5]) is True and senders[0].tokens() == [5]
    first.finish("engine lost")
    last, flags = senders[0].sent[-1]
    assert flags == FINAL and last.error().message() == "engine lost"
    third.outputs[0].add(6)
    third.finish(None)
    assert senders[2].sent == [(None, FINAL)]
    reasons = [labels["finished_reason"] for n, labels, _, _ in _Family.log if n == "wide:request_success_total"]
    assert reasons == ["abort", "length"]
    assert _calls("request_generation_tokens") == [1, 1] and _calls("request_prompt_tokens") == [2, 1]
    first.on_admit()
    assert len(_calls("request_queue_time_seconds")) == 1
    gone = _Sender(cancel_after=0)
    model.execute([_Request([1], 2, gone)])
    assert jobs[-1].emit([3]) is False and gone.sent == []
    assert len(_calls("time_to_first_token_seconds")) == 1  # only the token that was sent counted
    jobs[-1].finish(None)
    assert gone.sent == [(None, FINAL)]  # a cancelled request still gets its final flag (releases it)
    reasons = [labels["finished_reason"] for n, labels, _, _ in _Family.log if n == "wide:request_success_total"]
    assert reasons == ["abort", "length", "abort"]


def test_padded_tokens_pads_with_the_pad_id(gm):
    textgen = gm.load_sibling("textgen")
    a, b, c = (textgen.RowOutput(np.ones(2, np.int64), n) for n in (3, 1, 2))
    for t in (4, 5, 6):
        a.add(t)
    b.add(9)
    c.add(1), c.add(2)
    block = gm.padded_tokens([a, b, c], pad=-7)
    assert block.dtype == np.int64 and block.tolist() == [[4, 5, 6], [9, -7, -7], [1, 2, -7]]
    assert gm.padded_tokens([b], pad=3).tolist() == [[9]]


# ---------------------------------------------------------------------------------------------------
# the device helpers


def test_check_device_cache_ops_by_flavour_and_device(gm, runner, monkeypatch):
    import onnxruntime as ort

    made = []
    inflight = SimpleNamespace(TorchCacheOps=lambda: made.append(1))
    settings = runner[0]
    gm.check_device_cache_ops(settings, SimpleNamespace(device="cpu"), inflight)
    gm.check_device_cache_ops(settings, lambda f, p: None, inflight)  # no device attribute: the CPU
    assert made == []
    gm.check_device_cache_ops(settings, SimpleNamespace(device="cuda"), inflight)
    assert made == [1]
    monkeypatch.setattr(ort.OrtValue, "__dlpack__", None, raising=False)
    with pytest.raises(RuntimeError) as err:
        gm.check_device_cache_ops(settings, SimpleNamespace(device="cuda"), inflight)
    said = str(err.value)
    assert said.startswith("generation on cuda ") and "OrtValue.__dlpack__" in said, said
    assert f"onnxruntime {ort.__version__}" in said and "upgrade onnxruntime (1.32" in said, said
    trt = dataclasses.replace(settings, flavour="tensorrt", engine_model="e")
    gm.check_device_cache_ops(dataclasses.replace(trt, kv_cache_memory="cpu"), SimpleNamespace(), inflight)
    assert made == [1]
    gm.check_device_cache_ops(trt, SimpleNamespace(), inflight)
    assert made == [1, 1]


def test_bind_torch_input_binds_by_pointer_on_the_tensors_device(gm):
    import torch

    bound = []
    binding = SimpleNamespace(bind_input=lambda *a: bound.append(a))
    tensor = torch.zeros(2, 3, 4, dtype=torch.float16)
    gm._bind_torch_input(binding, "past_key_values.0.key", tensor)
    assert bound == [("past_key_values.0.key", "cpu", 0, np.dtype(np.float16), [2, 3, 4], tensor.data_ptr())]
    assert type(bound[0][4]) is list
    with pytest.raises(ValueError, match="^past_key_values.1.value: .*not contiguous"):
        gm._bind_torch_input(binding, "past_key_values.1.value", tensor.transpose(0, 2))
    assert len(bound) == 1
    gm._bind_torch_input(binding, "ids", torch.zeros(1, 5, dtype=torch.int64))
    assert bound[-1][3] == np.dtype(np.int64) and bound[-1][4] == [1, 5]


def test_bind_torch_input_takes_the_device_index(gm):
    bound = []
    binding = SimpleNamespace(bind_input=lambda *a: bound.append(a))
    tensor = SimpleNamespace(is_contiguous=lambda: True, dtype="torch.float32", shape=(1, 2),
                             device=SimpleNamespace(type="cuda", index=3), data_ptr=lambda: 1234)
    gm._bind_torch_input(binding, "x", tensor)
    assert bound == [("x", "cuda", 3, np.dtype(np.float32), [1, 2], 1234)]


def test_ort_step_runs_on_the_cpu_with_the_threads_asked_for(gm, tiny_repo, tiny, monkeypatch):
    import onnxruntime as ort

    seen = []
    real = ort.InferenceSession

    def session(path, options, providers):
        seen.append((path, options.intra_op_num_threads, list(providers)))
        return real(path, options, providers=providers)

    monkeypatch.setattr(ort, "InferenceSession", session)
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
    folder = str(tiny_repo / "wide_llm" / "1")
    settings = gm.Settings.load(folder)
    step = gm.ort_step(folder, settings, threads=2)
    default = gm.ort_step(folder, settings)
    import os

    path = os.path.join(folder, settings.onnx_file)
    assert seen == [(path, 2, ["CPUExecutionProvider"]), (path, 0, ["CPUExecutionProvider"])]
    assert step.device == "cpu" and default.device == "cpu"
    # where onnxruntime has the CUDA EP it comes first, and a session that got it puts the presents there
    cuda = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    monkeypatch.setattr(ort, "get_available_providers", lambda: cuda)
    monkeypatch.setattr(ort, "InferenceSession", lambda path, options, providers: seen.append(list(providers))
                        or SimpleNamespace(get_providers=lambda: cuda))
    assert gm.ort_step(folder, settings).device == "cuda" and seen[-1] == cuda


def test_log_goes_to_the_triton_logger_where_there_is_one(gm, monkeypatch):
    logged = []
    monkeypatch.setattr(gm, "pb_utils", SimpleNamespace(Logger=SimpleNamespace(log_info=logged.append)))
    gm._log("hello")
    assert logged == ["hello"]
    monkeypatch.setattr(gm, "pb_utils", SimpleNamespace())
    gm._log("nobody listens")  # no Logger: nothing, no error
    assert logged == ["hello"]


def test_load_sibling_loads_each_module_once(tiny_repo, monkeypatch):
    """In a repository (model.py loaded from its file, as Triton's Python backend does, outside any package) a
    sibling file is executed once, under a key of its path; the package's own module takes the package's."""
    import importlib
    import importlib.util
    import os
    import sys

    folder = tiny_repo / "wide_llm" / "1"
    spec = importlib.util.spec_from_file_location(f"wide_sibling_test_{abs(hash(str(folder)))}", folder / "model.py")
    model = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = model
    spec.loader.exec_module(model)
    first = model.load_sibling("textgen")
    assert model.load_sibling("textgen") is first
    path = os.path.join(str(folder), "textgen.py")
    key = f"wide_textgen_{abs(hash(path))}"
    assert sys.modules[key] is first and first.__file__ == path
    assert first.RowOutput.__module__ == key  # its dataclasses found their module while it executed
    assert model.load_sibling("metrics") is not first and model.load_sibling("metrics").__file__.endswith("metrics.py")
    assert model.load_decoding() is model.load_sibling("decoding")
    assert model.Row is model.load_sibling("rows").Row and model.C is model.load_sibling("contract")
    package = importlib.import_module("wide_export.tritonserver.generation_model")
    load = getattr(package, "file_load_sibling", package.load_sibling)  # its own, also under mutmut (support.py)
    assert load("textgen") is importlib.import_module("wide_export.generation.textgen")
    assert load("decoding") is importlib.import_module("wide_export.generation.decoding")  # a layer below
    assert load("contract") is importlib.import_module("wide_export.tritonserver.contract")  # its own folder
    # outside a package (as model.py runs in Triton) it loads the file beside it by path: the repository case above


def test_device_torch_says_what_this_python_lacks(gm, monkeypatch):
    import sys

    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the refusal needs a Python without it")
    with pytest.raises(RuntimeError) as err:
        gm.device_torch("in-flight batching on cuda")
    said = str(err.value)
    assert said.startswith("in-flight batching on cuda ") and f"PyTorch {torch.__version__} without CUDA" in said, said
    assert "pip install torch" in said
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    with pytest.raises(RuntimeError) as err:
        gm.device_torch("x")
    said = str(err.value)
    assert said.startswith("x ") and "no PyTorch" in said and "pip install torch" in said, said
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(cuda=SimpleNamespace(is_available=lambda: True)))
    assert gm.device_torch("x") is sys.modules["torch"]


# ---------------------------------------------------------------------------------------------------
# request parsing, validation, sampling: exact messages, boundaries, types


def _settings(runner, **changes):
    return dataclasses.replace(runner[0], **changes)


def test_validate_row_messages_and_boundaries(gm, runner):
    s = _settings(runner, max_total_tokens=10, vocab_size=50, max_prompt_tokens=0)

    def refused(row):
        with pytest.raises(gm.RequestError) as err:
            gm.validate_row(row, s)
        return str(err.value)

    ok = np.arange(1, 6, dtype=np.int64)  # 5 tokens
    gm.validate_row(gm.Row(ok, 5), s)  # 5 + 5 = the limit exactly
    gm.validate_row(gm.Row(np.ones(9, np.int64), 1), s)  # the longest prompt: one token left
    gm.validate_row(gm.Row(ok, 2, seed=0), s)  # seed 0 is a seed
    assert refused(gm.Row(np.zeros(0, np.int64), 2)) == "input_ids is empty: send at least one prompt token"
    assert refused(gm.Row(np.ones(10, np.int64), 1)) == (
        "prompt (10 tokens) + one new token exceeds the model's limit of 10 tokens")
    assert refused(gm.Row(ok, 6)) == ("prompt (5 tokens) + max_new_tokens (6) = 11 exceeds the model's limit of "
                                      "10 tokens")
    assert refused(gm.Row(ok, 2, seed=-1)) == "seed must be >= 0, got -1"
    assert refused(gm.Row(ok, 2, temperature=float("nan"))) == "temperature must be >= 0, got nan"
    assert refused(gm.Row(ok, 2, top_p=0.0)) == "top_p must be in (0, 1], got 0.0"
    gm.validate_row(gm.Row(ok, 2, top_p=1.0, temperature=0.0), s)
    assert refused(gm.Row(np.array([3, 50]), 2)) == "input_ids must lie in [0, 50), got values in [3, 50]"


def test_choose_tokens_samples_the_tempered_softmax(gm):
    """Row 0 greedy, row 1 sampled at temperature 2 over 4 tokens (top_p 1): 4000 seeded draws follow
    softmax(logits / 2) (computed here by hand) within 0.03, and row 0 stays the argmax."""
    logits = np.array([[0.0, 3.0, 1.0, 2.0], [1.0, 0.0, 2.0, 3.0]], np.float32)
    rows = [gm.Row(np.ones(1, np.int64), 1), gm.Row(np.ones(1, np.int64), 1, temperature=2.0)]
    rng = np.random.default_rng(5)
    draws = np.array([gm.choose_tokens(logits, rows, [None, rng]) for _ in range(4000)])
    assert draws.dtype == np.int64 and set(draws[:, 0]) == {1}
    z = np.exp(np.array([1.0, 0.0, 2.0, 3.0]) / 2)
    want = z / z.sum()  # exp(.)= [1.65, 1, 2.72, 4.48]: [0.167, 0.102, 0.276, 0.455]
    got = np.bincount(draws[:, 1], minlength=4) / len(draws)
    assert np.abs(got - want).max() < 0.03, (got, want)


def test_choose_tokens_top_p_keeps_the_smallest_set_and_ties_go_to_the_lower_id(gm):
    """A tiny top_p keeps one token: the most likely, the lower id among equals (as argmax picks);
    large logits (exp would overflow without the max subtracted) sample fine."""
    logits = np.zeros((1, 1000), np.float32)
    logits[0, [500, 7]] = 1.0  # a tie
    row = gm.Row(np.ones(1, np.int64), 1, temperature=1.0, top_p=1e-6)
    assert gm.choose_tokens(logits, [row], [np.random.default_rng(0)]).tolist() == [7]
    big = np.array([[1000.0, 999.0, -1000.0]], np.float32)
    hot = gm.Row(np.ones(1, np.int64), 1, temperature=1.0)
    picks = {int(gm.choose_tokens(big, [hot], [np.random.default_rng(s)])[0]) for s in range(40)}
    assert picks == {0, 1}  # e^0 : e^-1; the third is never drawn


def test_choose_tokens_below_the_greedy_temperature_is_argmax_and_a_tiny_top_p_keeps_the_top(gm):
    """The torch sampler's rule (model/generate.Sampling) in the repository's rows.py: a temperature below
    1e-5 is greedy (1e-310 overflowed logits / T to inf, nan probabilities, before; 5e-6 on two logits 1e-6 apart drew the second
    about half the time), a top_p below every probability keeps the most likely token alone, the argmax
    taken here by numpy; at 2e-5 it samples both."""
    rows_py = gm.load_sibling("rows")
    from wide_export.generation import torch_step as generate

    assert rows_py.GREEDY_TEMPERATURE == generate.GREEDY_TEMPERATURE == 1e-5
    logits = np.random.default_rng(0).normal(size=(3, 50)).astype(np.float32) * 8
    logits[2, :2] = [1.0, 1.0 - 1e-6]
    logits[2, 2:] = -5.0
    want = np.argmax(logits, axis=-1).tolist()
    assert want[2] == 0
    prompt = np.ones(1, np.int64)
    for t, p in ((1e-310, 1.0), (np.float32(1e-45), 1.0), (5e-6, 1.0), (5e-6, 0.5), (1.0, 1e-300), (1.0, 1e-45)):
        rows = [gm.Row(prompt, 1, temperature=t, top_p=p) for _ in range(3)]
        got = [gm.choose_tokens(logits, rows, [np.random.default_rng(s + b) for b in range(3)]).tolist()
               for s in range(30)]
        assert got == [want] * 30, (t, p)
    hot = gm.Row(prompt, 1, temperature=2e-5)
    assert {int(gm.choose_tokens(logits[2:], [hot], [np.random.default_rng(s)])[0]) for s in range(40)} == {0, 1}


def test_generate_tells_on_step_the_step_index_and_returns_when_told_to_stop(gm, runner, tiny):
    settings, step = runner
    seen = []
    rows = [gm.Row(np.array([1, 2, 3]), 6), gm.Row(np.array([4, 5, 6]), 6)]
    got = gm.generate(step, settings, rows, on_step=lambda s, fresh: seen.append((s, len(fresh))) or s < 2)
    assert seen == [(0, 2), (1, 2), (2, 2)]
    assert [g.tolist() for g in got] == [list(tiny_llm.reference_greedy(tiny[1], r.prompt, 3)) for r in rows]
    assert all(g.dtype == np.int64 and g.size == 3 for g in got)


def test_response_text_and_reasons_are_object_arrays(gm, monkeypatch):
    monkeypatch.setattr(gm, "pb_utils", _pb())
    textgen = gm.load_sibling("textgen")
    out = textgen.RowOutput(np.ones(1, np.int64), 1)
    out.add(3)
    tensors = {t.name(): t.as_numpy() for t in gm.response_tensors([out], np.array([[3]]), set(gm.C.OUTPUT_NAMES), ["é"])}
    assert tensors["text_output"].dtype == np.object_ and tensors["finish_reason"].dtype == np.object_
    assert tensors["text_output"].tolist() == [["é".encode()]]


def test_row_outputs_use_the_codec_for_text_and_stop_strings(gm):
    """Token t decodes to the letter chr(96 + t): with the codec the row stops at the stop string "cd"."""
    codec = SimpleNamespace(decode=lambda ids: "".join(chr(96 + i) for i in ids))
    out, = gm.row_outputs([gm.Row(np.array([1, 1], np.int64), 4, stop_ids=(9,), stop_strings=("cd",))], codec)
    assert out.codec is codec and out.stop_ids == frozenset({9}) and out.max_new_tokens == 4
    for t in (1, 3, 4):
        out.add(t)
    assert out.finish_reason == "stop" and out.text == "a" and out.prompt_tokens == 2
    plain, = gm.row_outputs([gm.Row(np.array([1]), 2)])
    assert plain.codec is None


def test_settings_load_accepts_cpu_memory_and_needs_both_split_engines(gm, tiny_repo, tmp_path):
    folder = tmp_path / "v"
    folder.mkdir()
    current = json.loads((tiny_repo / "wide_llm" / "1" / "generation.json").read_text())
    (folder / "generation.json").write_text(json.dumps({**current, "kv_cache_memory": "cpu"}))
    assert gm.Settings.load(str(folder)).kv_cache_memory == "cpu"
    (folder / "generation.json").write_text(json.dumps({**current, "flavour": "tensorrt", "prefill_model": "p"}))
    with pytest.raises(ValueError) as err:
        gm.Settings.load(str(folder))
    said = str(err.value)
    assert said.startswith(f"{folder / 'generation.json'}: ") and "engine_model" in said and "decode_model" in said


def test_parse_applies_the_settings_and_the_codec(gm, runner, monkeypatch):
    monkeypatch.setattr(gm, "pb_utils", _pb())
    model = gm.TritonPythonModel()
    model.settings = _settings(runner, eos_token_ids=[2])
    model.codec = SimpleNamespace(encode=lambda text, add: np.array([5, 6, 7] if add else [6, 7], np.int64))
    row, = model._parse(_Request(text_input=np.array([[b"hi"]], np.object_)))
    assert row.prompt.tolist() == [5, 6, 7] and row.stop_ids == (2,)
    assert row.max_new_tokens == model.settings.max_total_tokens - 3  # the rest of the context
    with pytest.raises(gm.RequestError, match="max_new_tokens must be >= 1"):
        model._parse(_Request([1, 2], 0))


def test_per_row_values_are_python_scalars_from_the_first_column(gm, monkeypatch):
    monkeypatch.setattr(gm, "pb_utils", _pb())
    request = _Request(temperature=np.array([[0.5, 9.0], [0.25, 9.0]], np.float32),
                       seed=np.array([[3], [4]], dtype=object))
    values = gm._per_row(request, "temperature", 2, None)
    assert values == [0.5, 0.25] and all(type(v) is float for v in values)
    assert gm._per_row(request, "seed", 2, None) == [3, 4]  # Python ints in an object array: taken as they are
    ints = gm._per_row(_Request(seed=np.array([[7]], np.int64)), "seed", 3, None)
    assert ints == [7, 7, 7] and all(type(v) is int for v in ints)


def test_per_row_lists_take_each_rows_own_list(gm, monkeypatch):
    monkeypatch.setattr(gm, "pb_utils", _pb())
    request = _Request(stop_token_ids=np.array([[1, 2], [3, 4], [5, 6]], np.int64))
    assert gm._per_row_lists(request, "stop_token_ids", 3) == [[1, 2], [3, 4], [5, 6]]


def test_stop_words_may_come_as_python_strings(gm, runner, monkeypatch):
    monkeypatch.setattr(gm, "pb_utils", _pb())
    codec = SimpleNamespace(encode=lambda text, add: np.array([1], np.int64))
    row, = gm.rows_from_request(_Request([1, 2], 2, stop_words=np.array([["end", b"stop"]], np.object_)),
                                runner[0], codec)
    assert row.stop_strings == ("end", "stop")


def test_a_request_without_parameters_is_no_probe(gm):
    assert gm._is_probe(SimpleNamespace()) is False
    assert gm._is_probe(SimpleNamespace(parameters=lambda: '{"wide_probe": 1}')) is True


# ---------------------------------------------------------------------------------------------------
# text, per-request slices, pads and probes through execute()

def _letters():
    """A codec whose token t is the letter chr(97 + t % 26)."""
    return SimpleNamespace(decode=lambda ids: "".join(chr(97 + int(i) % 26) for i in ids),
                           encode=lambda text, add: np.array([ord(c) - 97 for c in text], np.int64))


def _text_of(tokens):
    return "".join(chr(97 + int(t) % 26) for t in tokens)


def test_static_execute_gives_each_request_its_own_rows_and_text(gm, tiny_repo, tiny, monkeypatch):
    model = _model(gm, monkeypatch, tiny_repo)
    model.codec = _letters()
    prompts = [[3, 1, 4], [1, 5, 9], [2, 6, 5]]
    responses = model.execute([_Request(p, 2 + i) for i, p in enumerate(prompts)])
    for i, (p, r) in enumerate(zip(prompts, responses)):
        want = tiny_llm.reference_greedy(tiny[1], np.array(p), 2 + i)
        np.testing.assert_array_equal(_out(r, "output_ids")[0], want, err_msg=f"request {i}")
        assert _out(r, "text_output").tolist() == [[_text_of(want).encode()]]


def test_streamed_text_comes_with_each_token_and_ended_rows_get_the_pad(gm, tiny_repo, tiny, monkeypatch):
    """Two rows of one streaming request, the first stopping at its first token (that token made a
    stop id): later responses carry pad_token_id for it; text_output is each token's letter when
    asked for, and absent (output_ids only) when not."""
    model = _model(gm, monkeypatch, tiny_repo, decoupled=True)
    model.codec = _letters()
    two = np.array([[3, 1, 4], [1, 5, 9]], np.int64)
    want = [tiny_llm.reference_greedy(tiny[1], p, 3) for p in two]
    pad = model.settings.pad_token_id = tiny_llm.VOCAB - 1  # fed back for the ended row: a real id
    sender = _Sender()
    model.execute([_Request(two, 3, sender, stop_token_ids=np.array([[want[0][0]], [-5]], np.int64))])
    tokens = [_out(r, "output_ids")[:, 0].tolist() for r, _ in sender.sent if r is not None]
    assert tokens == [[want[0][0], want[1][0]], [pad, want[1][1]], [pad, want[1][2]]]
    texts = [_out(r, "text_output")[:, 0].tolist() for r, _ in sender.sent if r is not None]
    # the stop token that ended row 0 brings no text (as vLLM), row 1's first token its letter
    assert texts[0] == [b"", _text_of(want[1][:1]).encode()]
    assert [t[1] for t in texts[1:]] == [_text_of([want[1][1]]).encode(), _text_of([want[1][2]]).encode()]
    quiet = _Sender()
    model.execute([_Request([3, 1, 4], 2, quiet, wanted=["output_ids"])])
    assert [[t.name() for t in r.output_tensors] for r, _ in quiet.sent if r is not None] == [["output_ids"]] * 2


def test_a_request_finishing_early_does_not_hold_back_the_others_tokens(gm, tiny_repo, tiny, monkeypatch):
    model = _model(gm, monkeypatch, tiny_repo, decoupled=True)
    short, long = _Sender(), _Sender()
    a, b = [2, 2, 7], [5, 1, 1]
    model.execute([_Request(a, 1, short), _Request(b, 3, long)])
    assert short.tokens() == list(tiny_llm.reference_greedy(tiny[1], np.array(a), 1))
    assert long.tokens() == list(tiny_llm.reference_greedy(tiny[1], np.array(b), 3))
    assert _calls("request_prompt_tokens") == [3, 3] and _calls("request_generation_tokens") == [1, 3]


def test_a_client_gone_at_its_last_token_is_an_abort(gm, tiny_repo, monkeypatch):
    model = _model(gm, monkeypatch, tiny_repo, decoupled=True)
    sender = _Sender(leave_after=2)
    model.execute([_Request([1, 2, 3], 3, sender)])
    assert len(sender.tokens()) == 2 and sender.sent[-1] == (None, FINAL)
    reasons = [labels["finished_reason"] for n, labels, _, _ in _Family.log if n == "wide:request_success_total"]
    assert reasons == ["abort"]  # all three tokens were made, the last never reached it


def test_streaming_probes_stay_out_of_the_llm_metrics(gm, tiny_repo, monkeypatch):
    model = _model(gm, monkeypatch, tiny_repo, decoupled=True)
    model.metrics.gauges = lambda running, waiting: None
    sender = _Sender()
    model.execute([_Request([1, 2], 1, sender, probe=True)])
    assert sender.sent[-1] == (None, FINAL) and _Family.log == []
    jobs = []
    model.scheduler = SimpleNamespace(submit=jobs.append)
    monkeypatch.setattr(gm, "load_decoding", lambda: SimpleNamespace(Job=lambda **kw: SimpleNamespace(**kw)))
    model.execute([_Request([1, 2], 1, _Sender(), probe=True)])
    jobs[0].on_admit()
    jobs[0].finish(None)
    assert _Family.log == []


def test_inflight_responses_hold_the_outputs_asked_for_and_the_text(gm, tiny_repo, monkeypatch):
    model = _model(gm, monkeypatch, tiny_repo, decoupled=True)
    model.codec = _letters()
    jobs = []
    model.scheduler = SimpleNamespace(submit=jobs.append)
    monkeypatch.setattr(gm, "load_decoding", lambda: SimpleNamespace(Job=lambda **kw: SimpleNamespace(**kw)))
    only, texts = _Sender(), _Sender()
    model.execute([_Request([1, 2], 2, only, wanted=["output_ids"]),
                   _Request([1, 2], 2, texts, wanted=["output_ids", "text_output"])])
    for job in jobs:
        job.outputs[0].add(4)
        job.emit([4])
    assert [t.name() for t in only.sent[0][0].output_tensors] == ["output_ids"]
    assert _out(texts.sent[0][0], "text_output").tolist() == [[b"e"]]
