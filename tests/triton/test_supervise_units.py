"""supervise.py on fakes (no tritonserver): a fake server and process, a fake clock (time.monotonic and
time.sleep of the module), a scripted stub_state, an injected probe function that a threading.Event
holds back, and a fake tritonclient.grpc / queue for probe(). Every expectation is worked out by hand:
which check restarts, the exact reason and reports, the pauses between restarts, when a probe is
sent and with which arguments."""

from __future__ import annotations

import sys
import threading
import types

import numpy as np
import pytest

from tests.triton import fake_tritonclient
from wide_export.base.errors import WideError
from wide_export.tritonserver import supervise
from wide_export.tritonserver.server import Endpoints, Stub
from wide_export.tritonserver.supervise import PROBE_PARAMETER, Supervisor, probe, stub_state

WAIT_S = 30.0  # a bound for a stuck probe thread, not a timing expectation
GRPC = "127.0.0.1:8771"


class Clock:
    """time.monotonic / time.sleep of supervise.py: only the test moves it (sleep moves it too)."""

    def __init__(self, now: float = 1000.0):
        self.now = now
        self.sleeps: list = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


class Process:
    def __init__(self, code=None):
        self.code = code

    def poll(self):
        return self.code

    @property
    def returncode(self):
        return self.code


class Server:
    """The parts of TritonServer that Supervisor uses."""

    def __init__(self, clock: Clock, stubs: dict, python_models=None, max_reloads=5, reload_window=600.0,
                 restart_takes=2.3):
        self.clock = clock
        self.process = Process()
        self._stubs = dict(stubs)
        self.live = dict(stubs)  # what _current_stubs finds
        self.models = {s.model for s in stubs.values()} if python_models is None else set(python_models)
        self.max_reloads, self.reload_window = max_reloads, reload_window
        self.reloads: list[float] = []
        self.restarts = 0
        self.restart_error = None
        self.restart_takes = restart_takes
        self.endpoints = Endpoints(http="127.0.0.1:8770", grpc=GRPC, metrics=None)

    def _current_stubs(self):
        return dict(self.live)

    def python_models(self):
        return set(self.models)

    def restart(self):
        self.restarts += 1
        self.clock.now += self.restart_takes
        if self.restart_error is not None:
            raise self.restart_error
        self.process = Process()


class States:
    """stub_state of supervise.py: pid -> (state, ticks) or None; each call recorded."""

    def __init__(self, states: dict):
        self.states = dict(states)
        self.calls: list[int] = []

    def __call__(self, pid):
        self.calls.append(pid)
        return self.states.get(pid)


_HELD: list = []  # every Probes of a test: released at its end, whatever happened


@pytest.fixture(autouse=True)
def release_probes():
    yield
    while _HELD:
        _HELD.pop().go.set()


class Probes:
    """An injected probe_fn: records (url, model, timeout); answers `failure`, once `go` is set."""

    def __init__(self, failure=None, hold=False):
        _HELD.append(self)
        self.failure = failure
        self.calls: list[tuple] = []
        self.go = threading.Event()
        if not hold:
            self.go.set()
        self.entered = threading.Event()

    def __call__(self, url, model, timeout):
        self.calls.append((url, model, timeout))
        self.entered.set()
        assert self.go.wait(WAIT_S)
        return self.failure


A = Stub(101, "wide_llm", "wide_llm_0_0", "triton_python_backend_shm_region_1")
B = Stub(202, "textgen", "textgen_0_0", "triton_python_backend_shm_region_2")
C = Stub(303, "wide_llm", "wide_llm_0_1", "triton_python_backend_shm_region_3")


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(supervise, "time", clock)
    return clock


def supervisor(server, states, monkeypatch, probes=None, probe_every=5.0, probe_timeout=7.5):
    reports: list[str] = []
    monkeypatch.setattr(supervise, "stub_state", states)
    sup = Supervisor(server, report=reports.append, probe_every=probe_every, probe_timeout=probe_timeout,
                     probe_fn=probes if probes is not None else Probes())
    return sup, reports


def finish_probe(sup):
    assert sup._probe is not None
    sup._probe.join(WAIT_S)
    assert not sup._probe.is_alive()


# ---- stub_state: /proc/PID/stat


class FakePath:
    def __init__(self, text=None, error=None):
        self.text, self.error = text, error
        self.paths: list[str] = []

    def __call__(self, path):
        self.paths.append(path)
        return self

    def read_text(self):
        if self.error is not None:
            raise self.error
        return self.text


def stat_line(comm: str, state: str, utime: int, stime: int) -> str:
    # pid (comm) state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt utime stime cutime ...
    return f"4242 ({comm}) {state} 1 4242 4242 0 -1 4194304 10 20 30 40 {utime} {stime} 55 66 20 0 1 0\n"


def test_stub_state_reads_state_and_utime_plus_stime(monkeypatch):
    path = FakePath(stat_line("triton_python_backend_stub", "S", 1500, 27))
    monkeypatch.setattr(supervise, "Path", path)
    assert stub_state(4242) == ("S", 1527)
    assert path.paths == ["/proc/4242/stat"]


def test_stub_state_takes_the_fields_after_the_last_parenthesis(monkeypatch):
    """A command name may hold ') ' itself; the fields start after the last ')'."""
    monkeypatch.setattr(supervise, "Path", FakePath(stat_line("a) R 9 9 (b", "T", 3, 4)))
    assert stub_state(7) == ("T", 7)
    monkeypatch.setattr(supervise, "Path", FakePath(stat_line("x) Z 1 2 3 4 5 6 7 8 9 10 11 12 13 14", "t", 0, 0)))
    assert stub_state(7) == ("t", 0)


def test_stub_state_of_a_gone_or_unreadable_process_is_none(monkeypatch):
    monkeypatch.setattr(supervise, "Path", FakePath(error=FileNotFoundError("gone")))
    assert stub_state(5) is None
    monkeypatch.setattr(supervise, "Path", FakePath(error=PermissionError("no")))
    assert stub_state(5) is None
    monkeypatch.setattr(supervise, "Path", FakePath("garbage without a parenthesis"))
    assert stub_state(5) is None


def test_stub_state_of_a_real_process():
    """This very process: a running or sleeping state letter and a CPU tick count (/proc)."""
    import os

    state = stub_state(os.getpid())
    assert state is not None and state[0] in "RS" and isinstance(state[1], int) and state[1] >= 0
    assert stub_state(2 ** 22 + 12345) is None  # above pid_max: never a process


# ---- probe(): one streamed one-token request on a fake tritonclient.grpc


class FakeQueue:
    """queue.Queue of probe(): get() answers at once, or raises Empty; its timeout is recorded."""

    instances: list = []

    def __init__(self):
        self.items: list = []
        self.timeouts: list = []
        FakeQueue.instances.append(self)

    def put(self, item):
        self.items.append(item)

    def get(self, timeout=None):
        self.timeouts.append(timeout)
        if not self.items:
            raise FakeEmpty()
        return self.items.pop(0)


class FakeEmpty(Exception):
    pass


def grpc_module(answer="ok", fail_at=None, stop_fails=False):
    """answer: "ok" (callback with no error), an error object (callback with it), None (no callback)."""
    module = types.ModuleType("tritonclient.grpc")
    module.clients = []

    class InferenceServerClient:
        def __init__(self, *args, **kwargs):
            self.args, self.kwargs = args, kwargs
            self.calls: list[tuple] = []
            self.callback = None
            module.clients.append(self)

        def _call(self, name, args, kwargs):
            self.calls.append((name, args, kwargs))
            if fail_at == name:
                raise ConnectionError(f"{name} refused")

        def start_stream(self, *args, **kwargs):
            self._call("start_stream", args, kwargs)
            self.callback = kwargs.get("callback", args[0] if args else None)

        def async_stream_infer(self, *args, **kwargs):
            self._call("async_stream_infer", args, kwargs)
            if answer == "ok":
                self.callback("a result", None)
            elif answer is not None:
                self.callback(None, answer)

        def stop_stream(self, *args, **kwargs):
            self._call("stop_stream", args, kwargs)
            if stop_fails:
                raise RuntimeError("stop failed")

        def close(self, *args, **kwargs):
            self._call("close", args, kwargs)

    module.InferInput = fake_tritonclient.InferInput
    module.InferRequestedOutput = fake_tritonclient.InferRequestedOutput
    module.InferenceServerClient = InferenceServerClient
    return module


@pytest.fixture
def fake_grpc(monkeypatch):
    def install(**kwargs):
        module = grpc_module(**kwargs)
        package = types.ModuleType("tritonclient")
        package.__path__ = []
        package.grpc = module
        monkeypatch.setitem(sys.modules, "tritonclient", package)
        monkeypatch.setitem(sys.modules, "tritonclient.grpc", module)
        FakeQueue.instances = []
        monkeypatch.setattr(supervise, "queue", types.SimpleNamespace(Queue=FakeQueue, Empty=FakeEmpty))
        return module
    return install


def names(client):
    return [name for name, _, _ in client.calls]


def test_probe_sends_one_token_with_the_probe_parameter(fake_grpc):
    module = fake_grpc()
    assert probe(GRPC, "wide_llm", 10.0) is None
    (client,) = module.clients
    assert client.args == (GRPC,) and client.kwargs == {}
    assert names(client) == ["start_stream", "async_stream_infer", "stop_stream", "close"]
    _, args, kwargs = client.calls[0]
    assert args == () and set(kwargs) == {"callback", "stream_timeout"} and kwargs["stream_timeout"] == 10.0
    _, args, kwargs = client.calls[1]
    model, inputs = args
    assert model == "wide_llm"
    assert [(i.name, i.shape, i.dtype) for i in inputs] == [("input_ids", [1, 1], "INT64"),
                                                           ("max_new_tokens", [1, 1], "INT32")]
    assert inputs[0].data.dtype == np.int64 and inputs[0].data.tolist() == [[0]]
    assert inputs[1].data.dtype == np.int32 and inputs[1].data.tolist() == [[1]]
    assert set(kwargs) == {"outputs", "parameters"}
    assert [o.name for o in kwargs["outputs"]] == ["output_ids"]
    assert PROBE_PARAMETER == "wide_probe" and kwargs["parameters"] == {"wide_probe": True}
    assert kwargs["parameters"]["wide_probe"] is True
    assert client.calls[2] == ("stop_stream", (), {"cancel_requests": True})
    assert client.calls[3] == ("close", (), {})
    (answers,) = FakeQueue.instances
    assert answers.timeouts == [10.0]


def test_probe_callback_passes_on_the_error(fake_grpc):
    """The stream callback puts the error (not the result) on the queue."""
    module = fake_grpc()
    assert probe(GRPC, "m", 1.0) is None
    (client,) = module.clients
    (answers,) = FakeQueue.instances
    assert answers.items == []  # the answer (no error) was taken
    client.callback("a result", "the error")
    client.callback(result="another result", error=None)
    assert answers.items == ["the error", None]


def test_probe_reports_a_failed_request(fake_grpc):
    module = fake_grpc(answer="InferenceServerException: stub died")
    assert probe(GRPC, "textgen", 3.0) == "a one-token request failed: InferenceServerException: stub died"
    assert names(module.clients[0])[-2:] == ["stop_stream", "close"]
    assert module.clients[0].calls[1][1][0] == "textgen"


def test_probe_reports_no_answer_within_the_timeout(fake_grpc):
    module = fake_grpc(answer=None)
    assert probe(GRPC, "wide_llm", 10.0) == "no answer to a one-token request within 10 s"
    assert FakeQueue.instances[0].timeouts == [10.0]
    assert module.clients[0].calls[-2:] == [("stop_stream", (), {"cancel_requests": True}), ("close", (), {})]
    fake_grpc(answer=None)
    assert probe(GRPC, "wide_llm", 2.6) == "no answer to a one-token request within 3 s"


@pytest.mark.parametrize("where", ["start_stream", "async_stream_infer"])
def test_probe_of_an_unreachable_server_fails_and_still_closes(fake_grpc, where):
    module = fake_grpc(fail_at=where)
    assert probe(GRPC, "wide_llm", 5.0) == f"a one-token request failed: {where} refused"
    assert names(module.clients[0])[-2:] == ["stop_stream", "close"]
    assert module.clients[0].calls[-2][2] == {"cancel_requests": True}


def test_probe_ignores_errors_while_closing(fake_grpc):
    module = fake_grpc(stop_fails=True)
    assert probe(GRPC, "wide_llm", 5.0) is None
    assert names(module.clients[0]) == ["start_stream", "async_stream_infer", "stop_stream"]
    module = fake_grpc(answer="bad", stop_fails=True)
    assert probe(GRPC, "wide_llm", 5.0) == "a one-token request failed: bad"


def test_probe_with_the_real_queue(monkeypatch):
    """The real queue.Queue: an answer already there is taken at once; none at all is a queue.Empty
    that probe() catches (after a 10 ms wait here)."""
    for answer, expected in (("boom", "a one-token request failed: boom"),
                             (None, "no answer to a one-token request within 0 s")):
        module = grpc_module(answer=answer)
        package = types.ModuleType("tritonclient")
        package.grpc = module
        monkeypatch.setitem(sys.modules, "tritonclient", package)
        monkeypatch.setitem(sys.modules, "tritonclient.grpc", module)
        assert probe(GRPC, "wide_llm", 0.01) == expected
        assert names(module.clients[0])[-2:] == ["stop_stream", "close"]


# ---- Supervisor: construction


def test_supervisor_defaults(clock):
    server = Server(clock, {})
    sup = Supervisor(server)
    assert sup.server is server and sup.report is print
    assert (sup.probe_every, sup.probe_timeout) == (5.0, 10.0)
    assert sup.probe_fn is supervise.probe
    assert sup._probe is None and sup._probe_result is None and sup._stopped == {} and sup._cpu == {}


def test_default_report_prints(clock, capsys, monkeypatch):
    server = Server(clock, {})
    server.process = None
    monkeypatch.setattr(supervise, "stub_state", States({}))
    assert Supervisor(server).check() == "tritonserver exited unexpectedly (code None)"
    assert capsys.readouterr().out == ("tritonserver exited unexpectedly (code None); restarting tritonserver\n"
                                       "tritonserver restarted in 2.3 s; models ready\n")


# ---- Supervisor.check: a dead server, dead stubs


def test_all_well_is_none_and_takes_the_current_stubs(clock, monkeypatch):
    server = Server(clock, {A.pid: A})
    server.live = {A.pid: A, C.pid: C}  # a new instance showed up
    states = States({A.pid: ("S", 10), C.pid: ("R", 20)})
    sup, reports = supervisor(server, states, monkeypatch)
    assert sup.check() is None
    assert server._stubs == {A.pid: A, C.pid: C}
    assert reports == [] and server.restarts == 0 and server.reloads == [] and clock.sleeps == []
    assert states.calls == [A.pid, C.pid]


def test_a_server_that_exited_is_restarted(clock, monkeypatch):
    server = Server(clock, {A.pid: A})
    server.process = Process(-9)
    sup, reports = supervisor(server, States({A.pid: ("S", 1)}), monkeypatch)
    assert sup.check() == "tritonserver exited unexpectedly (code -9)"
    assert reports == ["tritonserver exited unexpectedly (code -9); restarting tritonserver",
                       "tritonserver restarted in 2.3 s; models ready"]
    assert server.restarts == 1 and server.reloads == [1000.0] and clock.sleeps == [0.0]
    assert sup.check() is None  # the restarted one (code None: running)
    assert server.restarts == 1


def test_a_server_that_exited_with_code_zero_is_restarted(clock, monkeypatch):
    server = Server(clock, {})
    server.process = Process(0)
    sup, reports = supervisor(server, States({}), monkeypatch)
    assert sup.check() == "tritonserver exited unexpectedly (code 0)"
    assert server.restarts == 1


def test_no_process_is_restarted(clock, monkeypatch):
    server = Server(clock, {A.pid: A})
    server.process = None
    sup, reports = supervisor(server, States({}), monkeypatch)
    assert sup.check() == "tritonserver exited unexpectedly (code None)"
    assert server.restarts == 1


def test_a_dead_stub_is_named(clock, monkeypatch):
    server = Server(clock, {A.pid: A, B.pid: B})
    server.live = {B.pid: B}
    server.models = {"wide_llm", "textgen"}
    sup, reports = supervisor(server, States({B.pid: ("S", 1)}), monkeypatch)
    why = "model wide_llm: backend process wide_llm_0_0 (pid 101) died"
    assert sup.check() == why
    assert reports[0] == why + "; restarting tritonserver"
    assert server.restarts == 1


def test_dead_stubs_of_two_models_are_listed_in_order(clock, monkeypatch):
    server = Server(clock, {B.pid: B, A.pid: A, C.pid: C})
    server.live = {C.pid: C}
    sup, _ = supervisor(server, States({C.pid: ("S", 1)}), monkeypatch)
    assert sup.check() == ("model textgen, wide_llm: backend process textgen_0_0 (pid 202), "
                           "wide_llm_0_0 (pid 101) died")


def test_two_dead_stubs_of_one_model_name_it_once(clock, monkeypatch):
    server = Server(clock, {A.pid: A, C.pid: C})
    server.live = {}
    sup, _ = supervisor(server, States({}), monkeypatch)
    assert sup.check() == "model wide_llm: backend process wide_llm_0_0 (pid 101), wide_llm_0_1 (pid 303) died"


def test_a_python_model_without_any_stub(clock, monkeypatch):
    server = Server(clock, {A.pid: A}, python_models={"wide_llm", "textgen", "bls"})
    sup, _ = supervisor(server, States({A.pid: ("S", 1)}), monkeypatch)
    assert sup.check() == "model bls, textgen: backend process (all stubs) died"


def test_a_dead_stub_and_an_orphan_model(clock, monkeypatch):
    server = Server(clock, {B.pid: B, C.pid: C}, python_models={"wide_llm", "textgen", "zeta"})
    server.live = {C.pid: C}
    sup, _ = supervisor(server, States({C.pid: ("S", 1)}), monkeypatch)
    assert sup.check() == "model textgen, zeta: backend process textgen_0_0 (pid 202) died"


def test_a_dead_stub_is_noticed_only_against_the_last_check(clock, monkeypatch):
    """A stub that went away is found once (the next check compares with the stubs then)."""
    server = Server(clock, {A.pid: A, C.pid: C})
    sup, _ = supervisor(server, States({A.pid: ("S", 1), C.pid: ("S", 1)}), monkeypatch)
    assert sup.check() is None
    server.live = {A.pid: A}
    assert sup.check() == "model wide_llm: backend process wide_llm_0_1 (pid 303) died"


# ---- hung stubs: stopped


def test_a_stub_stopped_for_two_checks_in_a_row(clock, monkeypatch):
    server = Server(clock, {A.pid: A, B.pid: B})
    states = States({A.pid: ("S", 5), B.pid: ("T", 9)})
    sup, reports = supervisor(server, states, monkeypatch)
    assert sup.check() is None
    assert server.restarts == 0
    clock.now += 1
    why = "model textgen: backend process textgen_0_0 (pid 202) is stopped"
    assert sup.check() == why
    assert reports == [why + "; restarting tritonserver", "tritonserver restarted in 2.3 s; models ready"]
    assert server.restarts == 1


def test_a_traced_stub_counts_as_stopped(clock, monkeypatch):
    server = Server(clock, {A.pid: A})
    sup, _ = supervisor(server, States({A.pid: ("t", 5)}), monkeypatch)
    assert sup.check() is None
    assert sup.check() == "model wide_llm: backend process wide_llm_0_0 (pid 101) is stopped"


@pytest.mark.parametrize("state", ["S", "R", "D", "X", "I"])
def test_other_states_are_not_stopped(clock, monkeypatch, state):
    server = Server(clock, {A.pid: A})
    sup, _ = supervisor(server, States({A.pid: (state, 5)}), monkeypatch, probe_every=1e9)
    for _ in range(4):
        assert sup.check() is None
    assert server.restarts == 0


def test_stopped_must_be_in_a_row(clock, monkeypatch):
    server = Server(clock, {A.pid: A})
    states = States({A.pid: ("T", 5)})
    sup, _ = supervisor(server, states, monkeypatch, probe_every=1e9)
    assert sup.check() is None
    states.states[A.pid] = ("S", 5)
    assert sup.check() is None
    states.states[A.pid] = ("T", 5)
    assert sup.check() is None  # one in a row again
    assert sup.check() == "model wide_llm: backend process wide_llm_0_0 (pid 101) is stopped"


def test_the_stopped_count_starts_again_after_a_restart(clock, monkeypatch):
    server = Server(clock, {A.pid: A})
    sup, _ = supervisor(server, States({A.pid: ("T", 5)}), monkeypatch, probe_every=1e9)
    assert sup.check() is None
    assert sup.check() is not None
    assert sup.check() is None  # first stopped check after the restart
    assert sup.check() == "model wide_llm: backend process wide_llm_0_0 (pid 101) is stopped"
    assert server.restarts == 2


def test_a_vanished_stub_is_skipped_and_the_next_is_still_checked(clock, monkeypatch):
    """stub_state None (gone between the listing and /proc): that stub is skipped, not the others.
    A probe is under way here (no new one is due)."""
    server = Server(clock, {A.pid: A, B.pid: B})
    states = States({A.pid: ("S", 5), B.pid: ("S", 5)})
    probes = Probes(hold=True)
    sup, _ = supervisor(server, states, monkeypatch, probes=probes)
    assert sup.check() is None
    clock.now += 5
    assert sup.check() is None
    assert probes.entered.wait(WAIT_S)
    states.states = {B.pid: ("T", 5)}
    assert sup.check() is None
    assert sup.check() == "model textgen: backend process textgen_0_0 (pid 202) is stopped"
    probes.go.set()
    finish_probe(sup)


# ---- hung stubs: quiet stubs are probed


def test_a_quiet_stub_is_probed_after_probe_every_seconds(clock, monkeypatch):
    server = Server(clock, {A.pid: A})
    probes = Probes()
    sup, reports = supervisor(server, States({A.pid: ("S", 40)}), monkeypatch, probes=probes, probe_timeout=7.5)
    assert sup.check() is None
    clock.now += 4.9
    assert sup.check() is None
    assert sup._probe is None and probes.calls == []
    clock.now += 0.1  # exactly probe_every seconds without CPU
    assert sup.check() is None
    finish_probe(sup)
    assert probes.calls == [(GRPC, "wide_llm", 7.5)]
    assert sup._probe.name == "wide-probe" and sup._probe.daemon is True
    assert reports == [] and server.restarts == 0


def test_a_busy_stub_is_not_probed(clock, monkeypatch):
    server = Server(clock, {A.pid: A})
    states = States({A.pid: ("R", 100)})
    probes = Probes()
    sup, _ = supervisor(server, states, monkeypatch, probes=probes)
    for _ in range(4):
        assert sup.check() is None
        clock.now += 3
        states.states[A.pid] = ("R", states.states[A.pid][1] + 7)
    assert probes.calls == [] and sup._probe is None
    # it stops using CPU at the last tick seen: quiet from the check that saw it (clock 1012)
    assert sup.check() is None
    clock.now += 4.5
    assert sup.check() is None
    assert probes.calls == []
    clock.now += 0.5
    assert sup.check() is None
    finish_probe(sup)
    assert probes.calls == [(GRPC, "wide_llm", 7.5)]


def test_the_first_quiet_stub_picks_the_model(clock, monkeypatch):
    server = Server(clock, {A.pid: A, B.pid: B})
    states = States({A.pid: ("S", 1), B.pid: ("S", 2)})
    probes = Probes()
    sup, _ = supervisor(server, states, monkeypatch, probes=probes)
    assert sup.check() is None
    clock.now += 2
    states.states[A.pid] = ("R", 50)  # A works, B stays quiet
    assert sup.check() is None
    clock.now += 3
    assert sup.check() is None
    finish_probe(sup)
    assert probes.calls == [(GRPC, "textgen", 7.5)]


def test_one_probe_at_a_time_and_a_pause_after_each(clock, monkeypatch):
    server = Server(clock, {A.pid: A})
    probes = Probes(hold=True)
    sup, _ = supervisor(server, States({A.pid: ("S", 3)}), monkeypatch, probes=probes, probe_every=5.0)
    assert sup.check() is None
    clock.now += 5
    assert sup.check() is None  # the probe starts (clock 1005)
    assert probes.entered.wait(WAIT_S)
    first = sup._probe
    clock.now += 20
    assert sup.check() is None  # still under way: no second one
    assert sup._probe is first and len(probes.calls) == 1
    probes.go.set()
    finish_probe(sup)
    assert sup.check() is None  # answered; the stub quiet since 1005 (20 s): the next probe
    finish_probe(sup)
    assert sup._probe is not first and len(probes.calls) == 2
    clock.now += 4
    assert sup.check() is None  # 4 s after the second probe started
    assert len(probes.calls) == 2
    clock.now += 1
    assert sup.check() is None
    finish_probe(sup)
    assert len(probes.calls) == 3


def test_a_probe_restarts_the_quiet_spell(clock, monkeypatch):
    server = Server(clock, {A.pid: A})
    probes = Probes()
    sup, _ = supervisor(server, States({A.pid: ("S", 3)}), monkeypatch, probes=probes)
    assert sup.check() is None
    clock.now += 6
    assert sup.check() is None  # probe 1, at clock 1006
    finish_probe(sup)
    clock.now += 4.5
    assert sup.check() is None  # 4.5 s since probe 1: none
    assert len(probes.calls) == 1
    clock.now += 0.5
    assert sup.check() is None
    finish_probe(sup)
    assert len(probes.calls) == 2


def probed_idle_pair(clock, monkeypatch, failure):
    """Stubs A and B idle for probe_every seconds, then one probe (answering `failure`) finished."""
    server = Server(clock, {A.pid: A, B.pid: B})
    states = States({A.pid: ("S", 3), B.pid: ("S", 8)})
    probes = Probes(failure=failure)
    sup, reports = supervisor(server, states, monkeypatch, probes=probes)
    assert sup.check() is None
    clock.now += 5
    assert sup.check() is None
    finish_probe(sup)
    return server, states, probes, sup, reports


def test_a_failed_probe_of_an_idle_stub_restarts(clock, monkeypatch):
    server, states, probes, sup, reports = probed_idle_pair(
        clock, monkeypatch, "no answer to a one-token request within 8 s")
    assert server.restarts == 0
    why = "model wide_llm: backend process is hung (no answer to a one-token request within 8 s)"
    assert sup.check() == why
    assert reports == [why + "; restarting tritonserver", "tritonserver restarted in 2.3 s; models ready"]
    assert server.restarts == 1 and len(probes.calls) == 1
    assert sup.check() is None  # the failure was used up; the CPU record starts again
    assert len(probes.calls) == 1


def test_a_failed_probe_of_a_stub_that_worked_meanwhile_is_forgiven(clock, monkeypatch):
    server, states, probes, sup, reports = probed_idle_pair(clock, monkeypatch, "no answer")
    states.states[B.pid] = ("R", 9)  # the other stub used CPU since the probe began
    clock.now += 1
    assert sup.check() is None
    assert server.restarts == 0 and reports == []
    states.states[B.pid] = ("S", 9)
    for _ in range(3):  # the failure is not held against a later check
        clock.now += 1
        assert sup.check() is None
    assert server.restarts == 0


@pytest.mark.parametrize("ticks", [0, 1, 3])
def test_a_failed_probe_of_a_stub_that_went_away(clock, monkeypatch, ticks):
    """Gone (stub_state None) when the probe's answer is looked at: not idle, whatever CPU ticks it had
    (a fresh stub may have 0 or 1); its death is the next check's business."""
    server = Server(clock, {A.pid: A})
    states = States({A.pid: ("S", ticks)})
    probes = Probes(failure="no answer")
    sup, _ = supervisor(server, states, monkeypatch, probes=probes)
    assert sup.check() is None
    clock.now += 5
    assert sup.check() is None
    finish_probe(sup)
    real = States({})
    gone = iter([("S", ticks)])  # seen in the loop, gone when the probe's ticks are compared

    def state(pid):
        real.calls.append(pid)
        return next(gone, None)

    monkeypatch.setattr(supervise, "stub_state", state)
    assert sup.check() is None
    assert server.restarts == 0 and real.calls == [A.pid, A.pid]


def test_a_probe_that_answered_does_not_restart(clock, monkeypatch):
    server = Server(clock, {A.pid: A})
    probes = Probes(failure=None)
    sup, reports = supervisor(server, States({A.pid: ("S", 3)}), monkeypatch, probes=probes)
    assert sup.check() is None
    clock.now += 5
    assert sup.check() is None
    finish_probe(sup)
    assert sup.check() is None
    assert server.restarts == 0 and reports == []


def test_an_empty_failure_is_no_failure(clock, monkeypatch):
    server = Server(clock, {A.pid: A})
    sup, _ = supervisor(server, States({A.pid: ("S", 3)}), monkeypatch, probes=Probes(failure=""))
    assert sup.check() is None
    clock.now += 5
    assert sup.check() is None
    finish_probe(sup)
    assert sup.check() is None
    assert server.restarts == 0


def test_a_pending_probe_failure_is_dropped_by_a_restart(clock, monkeypatch):
    server = Server(clock, {A.pid: A})
    probes = Probes(failure="no answer")
    sup, _ = supervisor(server, States({A.pid: ("S", 3)}), monkeypatch, probes=probes)
    assert sup.check() is None
    clock.now += 5
    assert sup.check() is None
    finish_probe(sup)
    server.process = Process(1)  # the server died meanwhile
    assert sup.check() == "tritonserver exited unexpectedly (code 1)"
    assert sup.check() is None  # the old probe's failure is not used against the new server
    assert server.restarts == 1


def test_a_restart_forgets_the_quiet_spells(clock, monkeypatch):
    server = Server(clock, {A.pid: A})
    probes = Probes()
    sup, _ = supervisor(server, States({A.pid: ("S", 3)}), monkeypatch, probes=probes)
    assert sup.check() is None  # quiet since 1000
    clock.now += 4
    server.process = Process(1)
    assert sup.check() is not None  # the restart takes 2.3 s: clock 1006.3
    assert sup.check() is None  # a new quiet spell from here
    assert probes.calls == [] and sup._probe is None


# ---- restarts: pauses, the window, giving up


def restart_once(sup, server):
    server.process = Process(1)
    return sup.check()


def test_restart_pauses_grow_and_then_it_gives_up(clock, monkeypatch):
    server = Server(clock, {}, max_reloads=5, reload_window=600.0, restart_takes=0.5)
    sup, reports = supervisor(server, States({}), monkeypatch)
    why = "tritonserver exited unexpectedly (code 1)"
    for _ in range(5):
        assert restart_once(sup, server) == why
    assert clock.sleeps == [0.0, 1.0, 2.0, 4.0, 8.0]
    assert reports == [why + "; restarting tritonserver", "tritonserver restarted in 0.5 s; models ready",
                       why + "; restarting tritonserver in 1 s", "tritonserver restarted in 0.5 s; models ready",
                       why + "; restarting tritonserver in 2 s", "tritonserver restarted in 0.5 s; models ready",
                       why + "; restarting tritonserver in 4 s", "tritonserver restarted in 0.5 s; models ready",
                       why + "; restarting tritonserver in 8 s", "tritonserver restarted in 0.5 s; models ready"]
    assert server.reloads == [1000.0, 1000.5, 1002.0, 1004.5, 1009.0]
    with pytest.raises(WideError) as caught:
        restart_once(sup, server)
    assert caught.value.message.startswith(f"{why}, ") and "6th failure in 600 s" in caught.value.message
    assert "wide-export serve" in caught.value.hint
    assert server.restarts == 5 and len(clock.sleeps) == 5 and len(reports) == 10
    assert len(server.reloads) == 6


def test_the_pause_stops_growing_at_eight_seconds(clock, monkeypatch):
    server = Server(clock, {}, max_reloads=9, reload_window=3600.0, restart_takes=1.0)
    sup, reports = supervisor(server, States({}), monkeypatch)
    for _ in range(8):
        restart_once(sup, server)
    assert clock.sleeps == [0.0, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0, 8.0]
    assert reports[-2] == "tritonserver exited unexpectedly (code 1); restarting tritonserver in 8 s"
    assert reports[-1] == "tritonserver restarted in 1.0 s; models ready"


def test_old_restarts_leave_the_window(clock, monkeypatch):
    server = Server(clock, {}, max_reloads=2, reload_window=100.0, restart_takes=0.0)
    sup, reports = supervisor(server, States({}), monkeypatch)
    server.reloads = [900.0, 950.0]  # 100 s and 50 s ago: the first one is out
    restart_once(sup, server)
    assert server.reloads == [950.0, 1000.0]
    assert clock.sleeps == [1.0]
    clock.now = 1049.5  # 950 is 99.5 s ago: still in
    with pytest.raises(WideError) as caught:
        restart_once(sup, server)
    assert "(code 1)" in caught.value.message and "3th failure in 100 s" in caught.value.message
    assert server.reloads == [950.0, 1000.0, 1049.5]


def test_a_restart_alone_in_its_window_has_no_pause(clock, monkeypatch):
    server = Server(clock, {}, max_reloads=1, reload_window=10.0, restart_takes=0.0)
    sup, reports = supervisor(server, States({}), monkeypatch)
    server.reloads = [990.0]  # exactly one window ago
    assert restart_once(sup, server) is not None
    assert server.reloads == [1000.0] and clock.sleeps == [0.0]
    assert reports[0] == "tritonserver exited unexpectedly (code 1); restarting tritonserver"


def test_max_reloads_restarts_are_allowed(clock, monkeypatch):
    server = Server(clock, {}, max_reloads=1, reload_window=10.0, restart_takes=0.0)
    sup, _ = supervisor(server, States({}), monkeypatch)
    assert restart_once(sup, server) is not None
    with pytest.raises(WideError, match=r"2th failure in 10 s"):
        restart_once(sup, server)
    assert server.restarts == 1


def test_a_restart_that_fails(clock, monkeypatch):
    server = Server(clock, {A.pid: A})
    server.restart_error = WideError("tritonserver did not become ready within 120 s\nlog tail:\nE0101 boom",
                                     hint="see the log")
    sup, reports = supervisor(server, States({}), monkeypatch)
    server.process = Process(6)
    with pytest.raises(WideError) as caught:
        sup.check()
    said = caught.value.message
    assert "(code 6)" in said and said.endswith(": tritonserver did not become ready within 120 s"), said  # first line
    assert "wide-export serve" in caught.value.hint and "see the log" not in caught.value.hint
    assert caught.value.__cause__ is None and caught.value.__suppress_context__ is True
    assert reports == ["tritonserver exited unexpectedly (code 6); restarting tritonserver"]
    assert server.restarts == 1


def test_other_errors_of_a_restart_pass_through(clock, monkeypatch):
    server = Server(clock, {})
    server.restart_error = OSError("no tritonserver binary")
    sup, reports = supervisor(server, States({}), monkeypatch)
    server.process = None
    with pytest.raises(OSError, match="no tritonserver binary"):
        sup.check()
    assert len(reports) == 1


def test_a_stub_gone_before_its_first_reading_is_not_probed_and_breaks_nothing(clock, monkeypatch):
    """A stub listed by _current_stubs but gone when /proc is read (stub_state None) has no CPU
    record yet: the check goes on (no KeyError out of `serve`), the quiet stubs that were read are
    probed with their own ticks only, and the next listing without it reports it dead."""
    server = Server(clock, {A.pid: A, B.pid: B})
    states = States({A.pid: ("S", 7)})  # B went before its first reading
    probes = Probes()
    sup, reports = supervisor(server, states, monkeypatch, probes=probes)
    assert sup.check() is None
    clock.now += 5
    assert sup.check() is None
    finish_probe(sup)
    assert probes.calls == [(GRPC, "wide_llm", 7.5)]
    assert sup._probe_result == ("wide_llm", None, {A.pid: 7})
    states.states = {}
    assert sup.check() is None  # every stub unreadable: nothing to probe, nothing raised
    server.live = {A.pid: A}
    assert sup.check() == "model textgen: backend process textgen_0_0 (pid 202) died"
    assert reports[0] == "model textgen: backend process textgen_0_0 (pid 202) died; restarting tritonserver"


def test_probe_of_a_url_the_client_refuses_is_a_failed_probe(fake_grpc):
    module = fake_grpc()

    def refuse(url):
        raise ValueError(f"bad url {url}")

    module.InferenceServerClient = refuse
    assert probe(GRPC, "wide_llm", 5.0) == f"a one-token request failed: bad url {GRPC}"
