"""LLM serving metrics of the generation model (copied as `<model>/1/metrics.py`).

Reported through the Python backend's custom metrics API (`pb_utils.MetricFamily`),
so they appear on tritonserver's Prometheus endpoint (`--metrics-port`) next to
Triton's own `nv_inference_*` metrics. Names follow vLLM's (with the `wide:`
prefix instead of `vllm:`), so dashboards built for vLLM need only the prefix
changed; every metric has the label `model_name`.

| name | kind | what |
|---|---|---|
| wide:time_to_first_token_seconds | histogram | request arrival (execute) -> its first token sent |
| wide:inter_token_latency_seconds | histogram | between two consecutive token responses of a request |
| wide:request_queue_time_seconds | histogram | arrival -> its prefill starts (in-flight: admitted into the batch) |
| wide:e2e_request_latency_seconds | histogram | arrival -> its last token |
| wide:request_prompt_tokens | histogram | prompt tokens per request (all rows) |
| wide:request_generation_tokens | histogram | generated tokens per request (all rows) |
| wide:prompt_tokens_total | counter | prompt tokens of finished requests |
| wide:generation_tokens_total | counter | generated tokens of finished requests |
| wide:request_success_total | counter | finished requests, label finished_reason = stop / length / abort |
| wide:num_requests_running | gauge | rows in the running (in-flight) batch |
| wide:num_requests_waiting | gauge | rows submitted, not yet admitted into the batch |

Requests answered with an error (malformed) are counted by Triton
(`nv_inference_request_failure`), not here. A request whose client went away
is finished with `finished_reason="abort"`.
"""

from __future__ import annotations

import time
from typing import Optional

PREFIX = "wide:"
LATENCY_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0,
                   20.0, 40.0, 80.0]
TOKEN_BUCKETS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000]
HISTOGRAMS = {
    "time_to_first_token_seconds": ("Time to first token in seconds.", LATENCY_BUCKETS),
    "inter_token_latency_seconds": ("Time between consecutive tokens of a request in seconds.", LATENCY_BUCKETS),
    "request_queue_time_seconds": ("Time from arrival until the prefill starts in seconds.", LATENCY_BUCKETS),
    "e2e_request_latency_seconds": ("Time from arrival until the last token in seconds.", LATENCY_BUCKETS),
    "request_prompt_tokens": ("Prompt tokens per request.", TOKEN_BUCKETS),
    "request_generation_tokens": ("Generated tokens per request.", TOKEN_BUCKETS),
}
COUNTERS = {
    "prompt_tokens_total": "Prompt tokens processed.",
    "generation_tokens_total": "Generated tokens.",
}
SUCCESS = "request_success_total"
FINISH_REASONS = ("stop", "length", "abort")
GAUGES = {
    "num_requests_running": "Rows decoding in the running batch.",
    "num_requests_waiting": "Rows waiting to join the running batch.",
}


class Metrics:
    """The model's metric objects; every call is a no-op where the API is missing (outside Triton,
    or a Triton whose Python backend has no MetricFamily / histograms)."""

    def __init__(self, pb_utils, model_name: str):
        self.enabled = pb_utils is not None and hasattr(pb_utils, "MetricFamily")
        self._metrics: dict = {}
        if not self.enabled:
            return
        family = pb_utils.MetricFamily
        labels = {"model_name": model_name}
        self._families = []  # kept alive: a family's metrics go when it is collected
        for name, (doc, buckets) in HISTOGRAMS.items():
            fam = family(name=PREFIX + name, description=doc, kind=family.HISTOGRAM)
            self._families.append(fam)
            self._metrics[name] = fam.Metric(labels=labels, buckets=buckets)
        for name, doc in COUNTERS.items():
            fam = family(name=PREFIX + name, description=doc, kind=family.COUNTER)
            self._families.append(fam)
            self._metrics[name] = fam.Metric(labels=labels)
        fam = family(name=PREFIX + SUCCESS, description="Finished requests by finish reason.", kind=family.COUNTER)
        self._families.append(fam)
        for reason in FINISH_REASONS:
            self._metrics[(SUCCESS, reason)] = fam.Metric(labels={**labels, "finished_reason": reason})
        for name, doc in GAUGES.items():
            fam = family(name=PREFIX + name, description=doc, kind=family.GAUGE)
            self._families.append(fam)
            self._metrics[name] = fam.Metric(labels=labels)

    def observe(self, name: str, value: float) -> None:
        if self.enabled:
            self._metrics[name].observe(value)

    def increment(self, name, value: float = 1.0) -> None:
        if self.enabled and value:
            self._metrics[name].increment(value)

    def gauges(self, running: int, waiting: int) -> None:
        if self.enabled:
            self._metrics["num_requests_running"].set(running)
            self._metrics["num_requests_waiting"].set(waiting)


class RequestTimer:
    """One request's timeline: arrival, prefill start, token responses, end."""

    def __init__(self, metrics: Metrics, clock=time.monotonic):
        self.metrics, self.clock = metrics, clock
        self.arrived = clock()
        self.last_token: Optional[float] = None
        self.ended = False

    def admitted(self) -> None:
        self.metrics.observe("request_queue_time_seconds", self.clock() - self.arrived)

    def token(self) -> None:
        """A response with new tokens was sent."""
        now = self.clock()
        if self.last_token is None:
            self.metrics.observe("time_to_first_token_seconds", now - self.arrived)
        else:
            self.metrics.observe("inter_token_latency_seconds", now - self.last_token)
        self.last_token = now

    def finished(self, reason: str, prompt_tokens: int, generated_tokens: int) -> None:
        """The request ended (once): `reason` stop / length / abort."""
        if self.ended:
            return
        self.ended = True
        m = self.metrics
        m.observe("e2e_request_latency_seconds", self.clock() - self.arrived)
        m.observe("request_prompt_tokens", prompt_tokens)
        m.observe("request_generation_tokens", generated_tokens)
        m.increment("prompt_tokens_total", prompt_tokens)
        m.increment("generation_tokens_total", generated_tokens)
        m.increment((SUCCESS, reason if reason in FINISH_REASONS else "stop"))
