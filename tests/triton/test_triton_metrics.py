"""metrics.py: what a request's timeline reports, against times computed by hand (a fake clock and
a fake MetricFamily standing in for the Python backend's)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest



class FakeMetric:
    def __init__(self, labels, buckets=None):
        self.labels, self.buckets, self.values, self.value = labels, buckets, [], 0.0

    def observe(self, v):
        self.values.append(v)

    def increment(self, v):
        self.value += v

    def set(self, v):
        self.value = v


class FakeFamily:
    HISTOGRAM, COUNTER, GAUGE = "histogram", "counter", "gauge"
    made: dict = {}

    def __init__(self, name, description, kind):
        self.name, self.kind = name, kind
        FakeFamily.made[name] = self
        self.metrics = []

    def Metric(self, labels, buckets=None):  # noqa: N802 - pb_utils' name
        metric = FakeMetric(labels, buckets)
        self.metrics.append(metric)
        return metric


@pytest.fixture
def metrics_module():
    from wide_export.tritonserver import metrics  # the file a repository carries as <model>/1/metrics.py

    return metrics


def test_a_request_timeline_is_reported_in_seconds_and_tokens(metrics_module):
    FakeFamily.made = {}
    metrics = metrics_module.Metrics(SimpleNamespace(MetricFamily=FakeFamily), "m")
    now = [10.0]
    timer = metrics_module.RequestTimer(metrics, clock=lambda: now[0])
    now[0] = 10.5
    timer.admitted()
    for t in (11.0, 11.25, 11.75):
        now[0] = t
        timer.token()
    now[0] = 12.0
    timer.finished("length", prompt_tokens=7, generated_tokens=3)
    timer.finished("stop", prompt_tokens=7, generated_tokens=3)  # a second end is ignored

    def one(name):
        (metric,) = FakeFamily.made["wide:" + name].metrics
        assert metric.labels == {"model_name": "m"}
        return metric

    assert one("request_queue_time_seconds").values == [0.5]
    assert one("time_to_first_token_seconds").values == [1.0]
    assert one("inter_token_latency_seconds").values == [0.25, 0.5]
    assert one("e2e_request_latency_seconds").values == [2.0]
    assert one("request_prompt_tokens").values == [7] and one("request_generation_tokens").values == [3]
    assert one("prompt_tokens_total").value == 7 and one("generation_tokens_total").value == 3
    by_reason = {m.labels["finished_reason"]: m.value for m in FakeFamily.made["wide:request_success_total"].metrics}
    assert by_reason == {"stop": 0, "length": 1, "abort": 0}
    metrics.gauges(3, 2)
    assert (one("num_requests_running").value, one("num_requests_waiting").value) == (3, 2)
    assert {f.kind for f in FakeFamily.made.values()} == {"histogram", "counter", "gauge"}


def test_without_the_metrics_api_every_call_is_a_no_op(metrics_module):
    metrics = metrics_module.Metrics(SimpleNamespace(), "m")
    timer = metrics_module.RequestTimer(metrics)
    timer.admitted(), timer.token(), timer.finished("stop", 1, 1), metrics.gauges(1, 1)
    assert not metrics.enabled
