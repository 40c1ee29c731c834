"""Circuit breakers: stop sending work to an inference endpoint or sandbox host that keeps failing.

    closed ──(failure_threshold consecutive faults)──► open
    open ──(open_s elapsed)──► half-open: up to `half_open_probes` calls let through
    half-open ──(a probe succeeds)──► closed
    half-open ──(a probe fails)──► open again, for another open_s

Callers bracket one call with `try_acquire()` and then exactly one of
`success()`, `failure()` or `release()` (neither: e.g. cancelled). Time comes
from the injected clock, so breakers run unchanged under the simulator's
virtual clock.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum

from tryloop.scheduler.config import BreakerConfig


class BreakerState(StrEnum):
    CLOSED = "closed"
    HALF_OPEN = "half_open"
    OPEN = "open"

    @property
    def gauge(self) -> int:
        """Numeric value exported as a metric: 0 closed, 1 half-open, 2 open."""
        return {BreakerState.CLOSED: 0, BreakerState.HALF_OPEN: 1, BreakerState.OPEN: 2}[self]


OnChange = Callable[["CircuitBreaker", BreakerState], None]


class CircuitBreaker:
    def __init__(self, kind: str, name: str, config: BreakerConfig, clock: Callable[[], float],
                 on_change: OnChange | None = None):
        self.kind = kind                  # "endpoint" | "host"
        self.name = name
        self._config = config
        self._clock = clock
        self._on_change = on_change
        self._state = BreakerState.CLOSED
        self._consecutive = 0
        self._opened_at = 0.0
        self._probes = 0                  # calls let through while half-open, not yet resolved
        self.opened = 0                   # times it opened, for reports

    @property
    def state(self) -> BreakerState:
        if self._state is BreakerState.OPEN and self._clock() >= self._opened_at + self._config.open_s:
            self._set(BreakerState.HALF_OPEN)
            self._probes = 0
        return self._state

    @property
    def reopens_at(self) -> float | None:
        """When an open breaker turns half-open (None unless open)."""
        return self._opened_at + self._config.open_s if self.state is BreakerState.OPEN else None

    def would_allow(self) -> bool:
        """Whether `try_acquire` would succeed now, without taking a probe."""
        state = self.state
        return state is BreakerState.CLOSED or (
            state is BreakerState.HALF_OPEN and self._probes < self._config.half_open_probes)

    def try_acquire(self) -> bool:
        state = self.state
        if state is BreakerState.CLOSED:
            return True
        if state is BreakerState.HALF_OPEN and self._probes < self._config.half_open_probes:
            self._probes += 1
            return True
        return False

    def success(self) -> None:
        self._consecutive = 0
        if self._state is BreakerState.HALF_OPEN:
            self._probes = 0
            self._set(BreakerState.CLOSED)

    def failure(self) -> None:
        self._consecutive += 1
        state = self.state
        if state is BreakerState.HALF_OPEN or (
                state is BreakerState.CLOSED and self._consecutive >= self._config.failure_threshold):
            self._open()

    def release(self) -> None:
        """A call let through ended without telling anything about health (e.g. it was cancelled)."""
        if self._state is BreakerState.HALF_OPEN and self._probes > 0:
            self._probes -= 1

    def _open(self) -> None:
        self._opened_at = self._clock()
        self._probes = 0
        self.opened += 1
        self._set(BreakerState.OPEN)

    def _set(self, state: BreakerState) -> None:
        if state is not self._state:
            self._state = state
            if self._on_change is not None:
                self._on_change(self, state)


class BreakerBoard:
    """All breakers of one scheduler, created on first use, keyed by (kind, name)."""

    def __init__(self, config: BreakerConfig, clock: Callable[[], float], on_change: OnChange | None = None):
        self._config = config
        self._clock = clock
        self._on_change = on_change
        self._breakers: dict[tuple[str, str], CircuitBreaker] = {}

    def get(self, kind: str, name: str) -> CircuitBreaker:
        key = (kind, name)
        b = self._breakers.get(key)
        if b is None:
            b = self._breakers[key] = CircuitBreaker(kind, name, self._config, self._clock, self._on_change)
        return b

    def endpoint(self, name: str) -> CircuitBreaker:
        return self.get("endpoint", name)

    def host(self, name: str) -> CircuitBreaker:
        return self.get("host", name)

    def all(self) -> list[CircuitBreaker]:
        return list(self._breakers.values())

    def next_change_at(self) -> float | None:
        """The earliest time an open breaker turns half-open."""
        times = [t for b in self._breakers.values() if (t := b.reopens_at) is not None]
        return min(times, default=None)
