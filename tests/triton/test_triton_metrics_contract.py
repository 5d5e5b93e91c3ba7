"""metrics.py: what Prometheus shows beyond the values (mutation testing): every family has
its description and kind, histograms their buckets, the families stay referenced (a collected family
takes its metrics off the endpoint), and an unknown finish reason is counted as "stop"."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.triton.test_triton_metrics import FakeFamily


class DescribedFamily(FakeFamily):
    def __init__(self, name, description, kind):
        super().__init__(name, description, kind)
        self.description = description


@pytest.fixture
def metrics_module():
    from wide_export.tritonserver import metrics

    return metrics


def test_every_family_is_described_kept_and_bucketed(metrics_module):
    m = metrics_module
    FakeFamily.made = {}
    metrics = m.Metrics(SimpleNamespace(MetricFamily=DescribedFamily), "m")
    made = FakeFamily.made
    want = {**{n: (doc, "histogram") for n, (doc, _) in m.HISTOGRAMS.items()},
            **{n: (doc, "counter") for n, doc in m.COUNTERS.items()},
            m.SUCCESS: ("Finished requests by finish reason.", "counter"),
            **{n: (doc, "gauge") for n, doc in m.GAUGES.items()}}
    assert {name: (f.description, f.kind) for name, f in made.items()} == {m.PREFIX + n: w for n, w in want.items()}
    assert all(isinstance(doc, str) and doc for doc, _ in want.values())
    assert sorted(map(id, metrics._families)) == sorted(map(id, made.values()))  # each family referenced
    for name, (_, buckets) in m.HISTOGRAMS.items():
        (metric,) = made[m.PREFIX + name].metrics
        assert metric.buckets == buckets
    assert m.HISTOGRAMS["request_prompt_tokens"][1] is m.TOKEN_BUCKETS
    assert m.HISTOGRAMS["time_to_first_token_seconds"][1] is m.LATENCY_BUCKETS


def test_an_unknown_finish_reason_counts_as_stop(metrics_module):
    FakeFamily.made = {}
    metrics = metrics_module.Metrics(SimpleNamespace(MetricFamily=FakeFamily), "m")
    metrics_module.RequestTimer(metrics).finished("eos", 1, 1)
    by_reason = {x.labels["finished_reason"]: x.value for x in FakeFamily.made["wide:request_success_total"].metrics}
    assert by_reason == {"stop": 1, "length": 0, "abort": 0}
