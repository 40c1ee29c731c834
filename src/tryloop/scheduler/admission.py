"""Adaptive admission control: how many episodes may run at once.

Episodes alternate between generation (GPU, behind the inference endpoint) and
tool / verifier runs (CPU, in sandboxes). Too few episodes and the GPUs idle
while sandboxes run tests; too many and requests queue at the server, the KV
cache thrashes (every turn re-prefills its whole context) and sandboxes queue
for CPU. The controller watches, per interval:

- inference latency against its uncongested baseline (the lowest interval mean
  seen, drifting up slowly so a slower model does not pin it forever),
- the share of inference time spent waiting for a permit (endpoint saturated),
- KV-cache usage and the server's own queue, from a pluggable `LoadProbe` per
  endpoint (`MetricsProbe` reads vLLM / SGLang metrics),
- the share of tool time spent waiting for a sandbox slot (CPU saturated),

and moves the limit like TCP: slow start (double) until the first congestion,
then additive increase (a step of `increase` or 1/16 of the limit, whichever
is larger) / multiplicative decrease of the episodes actually in flight, at
most once per round trip (one turn: generation plus tool run, as measured).
It only grows while the limit is what binds (in-flight near the limit and
work queued), and does not cut again while in-flight episodes still exceed
the last cut (they cannot be preempted; they drain as they finish).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from tryloop.scheduler.config import AdmissionConfig

# Fewer calls than this in an interval say little about latency: the first intervals of a run
# see only the calls that happened to be short (survivorship), which would set the baseline too low.
_MIN_CALLS = 32


@dataclass(frozen=True)
class LoadSample:
    """What an inference server says about its load; None where it does not say."""

    kv_usage: float | None = None          # 0..1, share of KV-cache blocks in use
    queue_depth: int | None = None         # requests waiting at the server
    running: int | None = None             # requests being decoded


class LoadProbe(Protocol):
    """Reads an endpoint's load, e.g. by scraping vLLM / SGLang `/metrics`."""

    async def sample(self) -> LoadSample: ...


class MetricsProbe:
    """A `LoadProbe` over a server's Prometheus metrics, e.g. `MetricsProbe(chat_client.metrics)`.

    `fetch` returns metric name -> value (summed over labels). Understands vLLM
    (`vllm:kv_cache_usage_perc` or the older `vllm:gpu_cache_usage_perc`,
    `vllm:num_requests_waiting` / `_running`) and SGLang (`sglang:token_usage`,
    `sglang:num_queue_reqs`, `sglang:num_running_reqs`).
    """

    _KV = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage")
    _WAITING = ("vllm:num_requests_waiting", "sglang:num_queue_reqs")
    _RUNNING = ("vllm:num_requests_running", "sglang:num_running_reqs")

    def __init__(self, fetch: Callable[[], Awaitable[Mapping[str, float]]]):
        self._fetch = fetch

    async def sample(self) -> LoadSample:
        m = await self._fetch()

        def first(names: tuple[str, ...]) -> float | None:
            return next((m[n] for n in names if n in m), None)

        kv, waiting, running = first(self._KV), first(self._WAITING), first(self._RUNNING)
        return LoadSample(kv_usage=kv, queue_depth=None if waiting is None else int(waiting),
                          running=None if running is None else int(running))


@dataclass
class _Window:
    """Observations since the last adjustment."""

    inference_calls: int = 0
    inference_s: float = 0.0
    inference_wait_s: float = 0.0
    execution_runs: int = 0
    execution_s: float = 0.0
    execution_wait_s: float = 0.0


@dataclass(frozen=True)
class Decision:
    limit: int
    change: str        # "grow" | "slow_start" | "back_off" | "hold"
    reason: str


@dataclass
class AdmissionController:
    config: AdmissionConfig
    limit: int = 0
    history: list[tuple[float, int]] = field(default_factory=list)   # (time, limit) at each change
    _window: _Window = field(default_factory=_Window)
    _baseline: float | None = None
    _slow_start: bool = True
    _cut_settles_at: float = float("-inf")       # no further cut before (signals lag a turn or two)
    _growth_settles_at: float = float("-inf")    # no further growth before
    last: Decision | None = None

    def __post_init__(self) -> None:
        self.limit = self.config.initial
        self._slow_start = self.config.slow_start

    # -- observations -----------------------------------------------------------------------

    def observe_inference(self, latency_s: float, wait_s: float) -> None:
        w = self._window
        w.inference_calls += 1
        w.inference_s += latency_s
        w.inference_wait_s += wait_s

    def observe_execution(self, busy_s: float, wait_s: float) -> None:
        w = self._window
        w.execution_runs += 1
        w.execution_s += busy_s
        w.execution_wait_s += wait_s

    # -- decision ---------------------------------------------------------------------------

    def update(self, now: float, *, in_flight: int, queued: int,
               load: Mapping[str, LoadSample] | None = None) -> Decision:
        """Close the current window and adjust the limit. Call every `config.interval_s`."""
        w, self._window = self._window, _Window()
        cfg = self.config
        if not cfg.adaptive:
            return self._decide(now, self.limit, "hold", "fixed limit")
        congestion = self._congestion(w, load or {})
        if congestion:
            self._slow_start = False
            if in_flight > self.limit or now < self._cut_settles_at:
                # The last decrease has not taken effect yet: episodes are never preempted, they
                # drain as they finish, and the signals lag by about a turn. Cutting again now
                # would drive the limit to the floor.
                return self._decide(now, self.limit, "hold", f"waiting for the last cut; {congestion}")
            self._cut_settles_at = now + 2 * self._turn_estimate(w)
            self._growth_settles_at = self._cut_settles_at
            new = max(cfg.min, int(in_flight * cfg.decrease_factor))
            return self._decide(now, min(new, self.limit), "back_off", congestion)
        if queued == 0 or in_flight < cfg.grow_utilisation * self.limit:
            return self._decide(now, self.limit, "hold", "limit not binding")
        if in_flight > self.limit:
            return self._decide(now, self.limit, "hold", "draining to the last cut")
        if now < self._growth_settles_at:
            return self._decide(now, self.limit, "hold", "waiting a turn to see the last change")
        # Like TCP, grow once per round trip: here a turn, after which the episodes admitted by
        # the last change have generated and run tools, and the signals show what they cost.
        self._growth_settles_at = now + self._turn_estimate(w)
        if self._slow_start:
            return self._decide(now, min(cfg.max, self.limit * 2), "slow_start", "healthy")
        # The additive step scales with the limit, so it moves at 10,000 episodes as at 100.
        step = max(cfg.increase, self.limit // 16)
        return self._decide(now, min(cfg.max, self.limit + step), "grow", "healthy")

    @staticmethod
    def _turn_estimate(w: _Window) -> float:
        """Seconds of one turn (generation + tool run, waits included): how long a change of the
        limit takes to show in the signals."""
        gen = (w.inference_s + w.inference_wait_s) / w.inference_calls if w.inference_calls else 0.0
        tool = (w.execution_s + w.execution_wait_s) / w.execution_runs if w.execution_runs else 0.0
        return gen + tool

    def _congestion(self, w: _Window, load: Mapping[str, LoadSample]) -> str:
        cfg = self.config
        for endpoint, sample in load.items():
            if sample.kv_usage is not None and sample.kv_usage > cfg.kv_high:
                return f"KV cache of {endpoint} at {sample.kv_usage:.0%}"
            if sample.queue_depth and sample.running and sample.queue_depth > cfg.max_server_queue_share * sample.running:
                return f"{endpoint} queues {sample.queue_depth} requests behind {sample.running} running"
        if w.inference_calls >= _MIN_CALLS:
            mean = w.inference_s / w.inference_calls
            if self._baseline is None or mean < self._baseline:
                self._baseline = mean
            else:
                # Drift up slowly: a baseline measured under an old model or prompt mix must
                # not make every later interval look congested.
                self._baseline *= 1.001
            if mean > cfg.latency_tolerance * self._baseline:
                return f"inference latency {mean:.3g}s > {cfg.latency_tolerance:g}x baseline {self._baseline:.3g}s"
            total = w.inference_s + w.inference_wait_s
            if total > 0 and w.inference_wait_s / total > cfg.max_inference_wait_share:
                return f"inference permits: {w.inference_wait_s / total:.0%} of time waiting"
        if w.execution_runs:
            total = w.execution_s + w.execution_wait_s
            if total > 0 and w.execution_wait_s / total > cfg.max_execution_wait_share:
                return f"sandbox slots: {w.execution_wait_s / total:.0%} of time waiting"
        return ""

    def _decide(self, now: float, new: int, change: str, reason: str) -> Decision:
        if new != self.limit or not self.history:
            self.history.append((now, new))
        self.limit = new
        self.last = Decision(new, change, reason)
        return self.last
