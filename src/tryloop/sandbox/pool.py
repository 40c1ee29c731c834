"""Warm pools: sandboxes started ahead of time for one snapshot.

`acquire()` hands out an idle sandbox (a hit) or starts one (a miss);
`release()` resets it in the background and puts it back, or destroys it if
it is unhealthy. A background task keeps `size` sandboxes idle. Every step is
counted in Prometheus metrics labelled by pool (`label`, by default the pool's
name). Pools that share a label add up, gauges included: a run that opens a
pool per task labels them by task source, so its series stay a handful however
many tasks it walks over (a series per task would grow every scrape and the
run's live state without bound).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from collections import deque

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from tryloop.config import PoolConfig, SandboxConfig
from tryloop.errors import SandboxError
from tryloop.sandbox.layers import Snapshot
from tryloop.sandbox.runtime import SandboxRuntime
from tryloop.sandbox.sandbox import Sandbox

_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0)


class PoolMetrics:
    """Prometheus metrics of all pools sharing a registry (default: the global one)."""

    _default: PoolMetrics | None = None
    _by_registry: weakref.WeakKeyDictionary[CollectorRegistry, PoolMetrics] = weakref.WeakKeyDictionary()

    def __init__(self, registry: CollectorRegistry | None):
        kw = {"registry": registry} if registry is not None else {}
        self.acquire = Histogram("tryloop_pool_acquire_seconds", "Time to hand out a sandbox",
                                 ["pool", "result"], buckets=_BUCKETS, **kw)
        self.acquired = Counter("tryloop_pool_acquire_total", "Sandboxes handed out", ["pool", "result"], **kw)
        self.reset = Histogram("tryloop_pool_reset_seconds", "Time to reset a released sandbox",
                               ["pool"], buckets=_BUCKETS, **kw)
        self.create = Histogram("tryloop_pool_create_seconds", "Time to start a sandbox",
                                ["pool"], buckets=_BUCKETS, **kw)
        self.teardown = Histogram("tryloop_pool_teardown_seconds", "Time to destroy a sandbox",
                                  ["pool"], buckets=_BUCKETS, **kw)
        self.live = Gauge("tryloop_pool_live", "Sandboxes alive (idle or in use)", ["pool"], **kw)
        self.idle = Gauge("tryloop_pool_idle", "Sandboxes ready to hand out", ["pool"], **kw)
        self.failures = Counter("tryloop_pool_failures_total", "Failures by reason", ["pool", "reason"], **kw)

    @classmethod
    def for_registry(cls, registry: CollectorRegistry | None) -> PoolMetrics:
        # One set of metric objects per registry (prometheus refuses duplicates);
        # weakly keyed, so a registry that is gone takes its metrics with it.
        if registry is None:
            if cls._default is None:
                cls._default = cls(None)
            return cls._default
        if registry not in cls._by_registry:
            cls._by_registry[registry] = cls(registry)
        return cls._by_registry[registry]


class WarmPool:
    """Pre-started sandboxes of one snapshot. Use as `async with WarmPool(...) as pool`."""

    def __init__(self, runtime: SandboxRuntime, snapshot: Snapshot, sandbox: SandboxConfig | None = None,
                 config: PoolConfig | None = None, *, name: str | None = None,
                 registry: CollectorRegistry | None = None, label: str | None = None):
        self.runtime = runtime
        self.snapshot = snapshot
        self.sandbox_config = sandbox or SandboxConfig()
        self.config = config or PoolConfig()
        self.name = name or snapshot.id[:12]
        self.label = label or self.name      # the metrics' `pool` label
        self.metrics = PoolMetrics.for_registry(registry)
        self._shown = (0, 0)                 # (live, idle) this pool has added to its label's gauges
        self._idle: deque[Sandbox] = deque()
        self._in_use: set[Sandbox] = set()
        self._creating = 0
        self._resetting = 0
        self._unplaced: set[Sandbox] = set()  # created, not yet idle, in use or destroyed
        self._wake = asyncio.Event()
        self._idle_event = asyncio.Event()
        self._closed = False
        self._tasks: set[asyncio.Task] = set()
        self._refiller: asyncio.Task | None = None
        self.hits = 0
        self.misses = 0

    # ---- lifecycle ---------------------------------------------------------

    async def start(self, wait: bool = True) -> WarmPool:
        self._refiller = asyncio.create_task(self._refill_loop())
        if wait:
            await self.wait_ready()
        return self

    async def wait_ready(self, timeout: float = 120.0) -> None:
        """Wait until `size` sandboxes are idle."""
        deadline = time.monotonic() + timeout
        while len(self._idle) < self.config.size:
            if time.monotonic() > deadline:
                raise SandboxError(f"pool {self.name}: only {len(self._idle)}/{self.config.size} ready "
                                   f"after {timeout}s")
            self._idle_event.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle_event.wait(), 0.5)

    async def __aenter__(self) -> WarmPool:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Destroy every sandbox of the pool, idle or in use."""
        self._closed = True
        self._wake.set()
        if self._refiller and not self._refiller.done():
            # Not cancelled: a cancelled gather would drop sandboxes whose creation
            # already finished. The loop sees _closed and destroys what it made.
            try:
                await asyncio.wait_for(asyncio.shield(self._refiller), 30)
            except TimeoutError:
                # A refill stuck past that is cancelled; what it had already made is in _unplaced.
                self._refiller.cancel()
                await asyncio.gather(self._refiller, return_exceptions=True)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        victims = list(self._idle) + list(self._in_use) + list(self._unplaced)
        self._idle.clear()
        self._in_use.clear()
        self._unplaced.clear()
        await asyncio.gather(*(self._destroy(sb) for sb in victims), return_exceptions=True)
        self._update_gauges()

    # ---- acquire / release -------------------------------------------------

    @property
    def live(self) -> int:
        return len(self._idle) + len(self._in_use) + self._resetting

    @property
    def idle(self) -> int:
        return len(self._idle)

    async def acquire(self) -> Sandbox:
        """A ready sandbox in the snapshot's exact state."""
        if self._closed:
            raise SandboxError(f"pool {self.name} is closed")
        t0 = time.perf_counter()
        while self._idle:
            sb = self._idle.popleft()
            if sb.alive:
                self._in_use.add(sb)
                self.hits += 1
                self._record_acquire("hit", t0)
                self._wake.set()
                return sb
            self.metrics.failures.labels(self.label, "dead_idle").inc()
            self._spawn(self._destroy(sb))
        if self.live + self._creating >= self.config.max_live:
            raise SandboxError(f"pool {self.name}: max_live={self.config.max_live} sandboxes already alive")
        sb = await self._create()
        self._unplaced.discard(sb)
        self._in_use.add(sb)
        self.misses += 1
        self._record_acquire("miss", t0)
        self._wake.set()
        return sb

    def release(self, sb: Sandbox) -> None:
        """Give a sandbox back: it is reset in the background, or destroyed if unhealthy."""
        if sb not in self._in_use:
            raise SandboxError(f"sandbox {sb.id} does not belong to pool {self.name} or was released twice")
        self._in_use.discard(sb)
        self._resetting += 1
        self._spawn(self._recycle(sb))

    async def _recycle(self, sb: Sandbox) -> None:
        try:
            if self._closed or not sb.alive:
                reason = "closed" if self._closed else "dead_on_release"
                if not self._closed:
                    self.metrics.failures.labels(self.label, reason).inc()
                await self._destroy(sb)
                return
            t0 = time.perf_counter()
            try:
                await sb.reset()
            except Exception:
                self.metrics.failures.labels(self.label, "reset_failed").inc()
                await self._destroy(sb)
                return
            self.metrics.reset.labels(self.label).observe(time.perf_counter() - t0)
            if len(self._idle) >= self.config.size or self._closed:
                await self._destroy(sb)
            else:
                self._idle.append(sb)
                self._idle_event.set()
        finally:
            self._resetting -= 1
            self._update_gauges()

    # ---- internals -----------------------------------------------------------

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _record_acquire(self, result: str, t0: float) -> None:
        self.metrics.acquire.labels(self.label, result).observe(time.perf_counter() - t0)
        self.metrics.acquired.labels(self.label, result).inc()
        self._update_gauges()

    def _update_gauges(self) -> None:
        # by difference, not set(): other pools may add to the same label
        live, idle = self.live, len(self._idle)
        self.metrics.live.labels(self.label).inc(live - self._shown[0])
        self.metrics.idle.labels(self.label).inc(idle - self._shown[1])
        self._shown = (live, idle)

    async def _create(self) -> Sandbox:
        self._creating += 1
        t0 = time.perf_counter()
        try:
            sb = await self.runtime.create(self.snapshot, self.sandbox_config)
            self._unplaced.add(sb)      # a cancelled gather of creations would drop it otherwise
        except Exception:
            self.metrics.failures.labels(self.label, "create_failed").inc()
            raise
        finally:
            self._creating -= 1
        self.metrics.create.labels(self.label).observe(time.perf_counter() - t0)
        return sb

    async def _destroy(self, sb: Sandbox) -> None:
        t0 = time.perf_counter()
        try:
            await sb.close()
        except Exception:
            self.metrics.failures.labels(self.label, "teardown_failed").inc()
        self.metrics.teardown.labels(self.label).observe(time.perf_counter() - t0)

    async def _refill_loop(self) -> None:
        failures = 0
        while not self._closed:
            want = self.config.size - len(self._idle) - self._creating - self._resetting
            room = self.config.max_live - self.live - self._creating
            n = min(want, room, self.config.refill_concurrency)
            if n <= 0:
                self._wake.clear()
                await self._wake.wait()
                continue
            results = await asyncio.gather(*(self._create() for _ in range(n)), return_exceptions=True)
            for r in results:
                if isinstance(r, Sandbox):
                    self._unplaced.discard(r)
                    if self._closed:
                        await self._destroy(r)
                    else:
                        self._idle.append(r)
                        self._idle_event.set()
                    failures = 0
                else:
                    failures += 1
            self._update_gauges()
            if failures:
                # Back off so a broken host is not hammered; the failure metric says why.
                await asyncio.sleep(min(5.0, 0.05 * 2 ** min(failures, 7)))
