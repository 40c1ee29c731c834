"""Prometheus metrics of one scheduler, on a registry the caller may pass in.

Names start with `tryloop_scheduler_`. Gauges that describe "now" (queue depth,
in-flight by stage, capacity in use, breaker states, admission limit) are
refreshed on every dispatcher pass (capacity: every admission interval and
on each `summary()`); counters and histograms are updated as things happen.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from tryloop.scheduler.breaker import CircuitBreaker
from tryloop.scheduler.failures import FailureInfo

# Episode stages last from milliseconds (a no-op runner) to an hour (a long agent run).
_STAGE_BUCKETS = (0.001, 0.01, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, float("inf"))
_CALL_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, float("inf"))


class SchedulerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        p = "tryloop_scheduler_"
        self.queue_depth = Gauge(p + "queue_depth", "episodes waiting to start (ready, backing off, or parked "
                                 "behind an open breaker)", ["queue"], registry=r)
        self.in_flight = Gauge(p + "in_flight", "episodes in an active state", ["stage"], registry=r)
        self.admission_limit = Gauge(p + "admission_limit", "episodes allowed to run at once", registry=r)
        self.capacity_in_use = Gauge(p + "capacity_in_use", "permits / slots in use", ["resource", "name"], registry=r)
        self.capacity_limit = Gauge(p + "capacity_limit", "permits / slots available", ["resource", "name"], registry=r)
        self.capacity_busy_share = Gauge(p + "capacity_busy_share", "average share of capacity in use since start",
                                         ["resource", "name"], registry=r)
        self.breaker_state = Gauge(p + "breaker_state", "0 closed, 1 half-open, 2 open", ["kind", "name"], registry=r)
        self.breaker_transitions = Counter(p + "breaker_transitions", "breaker state changes",
                                           ["kind", "name", "to"], registry=r)
        self.submitted = Counter(p + "submitted", "episodes accepted", registry=r)
        self.duplicates = Counter(p + "duplicates", "submissions of an id already known, and results recorded "
                                  "for an episode that had already ended (both ignored)", ["what"], registry=r)
        self.finished = Counter(p + "finished", "episodes ended", ["state"], registry=r)
        self.failures = Counter(p + "failures", "failed attempts by kind and type (retried or final)",
                                ["kind", "type"], registry=r)
        self.retries = Counter(p + "retries", "attempts retried, by failure kind", ["kind"], registry=r)
        self.quarantined = Gauge(p + "quarantined_tasks", "tasks quarantined after repeated infrastructure failures",
                                 registry=r)
        self.stage_seconds = Histogram(p + "stage_seconds", "time an episode spent per stage (all attempts), "
                                       "and in total from submission to end", ["stage"], buckets=_STAGE_BUCKETS,
                                       registry=r)
        self.inference_seconds = Histogram(p + "inference_seconds", "one generation request, permit held",
                                           ["endpoint"], buckets=_CALL_BUCKETS, registry=r)
        self.capacity_wait_seconds = Histogram(p + "capacity_wait_seconds", "time waiting for a permit / slot",
                                               ["resource"], buckets=_CALL_BUCKETS, registry=r)
        self._inference_wait = self.capacity_wait_seconds.labels("inference")
        self._execution_wait = self.capacity_wait_seconds.labels("execution")
        self._failures: dict[tuple[str, str], Counter] = {}
        self._inference_by_endpoint: dict[str, Histogram] = {}
        self._finished_by_state: dict[str, Counter] = {}
        self._stage_by_name: dict[str, Histogram] = {}

    def on_inference(self, endpoint: str, latency_s: float, wait_s: float) -> None:
        h = self._inference_by_endpoint.get(endpoint)
        if h is None:
            h = self._inference_by_endpoint[endpoint] = self.inference_seconds.labels(endpoint)
        h.observe(latency_s)
        self._inference_wait.observe(wait_s)

    def on_execution(self, wait_s: float) -> None:
        self._execution_wait.observe(wait_s)

    def on_end(self, state: str, stage_seconds: dict[str, float]) -> None:
        # Label lookups cost more than the updates: keep the children.
        c = self._finished_by_state.get(state)
        if c is None:
            c = self._finished_by_state[state] = self.finished.labels(state)
        c.inc()
        for stage, seconds in stage_seconds.items():
            h = self._stage_by_name.get(stage)
            if h is None:
                h = self._stage_by_name[stage] = self.stage_seconds.labels(stage)
            h.observe(seconds)

    def on_failure(self, info: FailureInfo) -> None:
        key = (info.kind.value, info.type)
        c = self._failures.get(key)
        if c is None:
            c = self._failures[key] = self.failures.labels(*key)
        c.inc()

    def on_breaker(self, breaker: CircuitBreaker) -> None:
        state = breaker.state
        self.breaker_state.labels(breaker.kind, breaker.name).set(state.gauge)
        self.breaker_transitions.labels(breaker.kind, breaker.name, state.value).inc()

    def refresh_capacity(self, snapshot: dict[str, dict[str, dict[str, float]]]) -> None:
        for resource, pools in snapshot.items():
            for name, s in pools.items():
                self.capacity_in_use.labels(resource, name).set(s["in_use"])
                self.capacity_limit.labels(resource, name).set(s["limit"])
                self.capacity_busy_share.labels(resource, name).set(s["busy_share"])
