"""Sandboxes for episodes: a small warm pool per task snapshot, created on first use.

A released sandbox is reset in the background and handed to the next episode of
the same task (a hit); a task seen for the first time costs one cold create (a
miss). Pools of tasks not used for a while are closed, so memory stays bounded
when a run walks over thousands of tasks; their metrics are labelled by task
source, not by task, so the metrics stay bounded too.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict

from prometheus_client import CollectorRegistry

from tryloop.config import PoolConfig
from tryloop.sandbox import Sandbox, SandboxRuntime, WarmPool
from tryloop.tasks.model import Task
from tryloop.tasks.testrun import sandbox_config_for, task_snapshot


class Environments:
    def __init__(self, runtime: SandboxRuntime, *, per_task: int = 1, max_pools: int = 32,
                 registry: CollectorRegistry | None = None, max_live: int = 64):
        """`max_live`: sandboxes of one task alive at once (idle and in use)."""
        self.runtime = runtime
        self.per_task = per_task
        self.max_live = max_live
        self.max_pools = max_pools
        self.registry = registry
        self._pools: OrderedDict[str, WarmPool] = OrderedDict()
        self._owner: dict[str, WarmPool] = {}
        self._closing: set[asyncio.Task] = set()
        self.retired_hits = 0
        self.retired_misses = 0

    async def acquire(self, task: Task) -> Sandbox:
        cfg = sandbox_config_for(task)
        snap = task_snapshot(self.runtime, task, cfg)
        pool = self._pools.get(snap.id)
        if pool is None:
            pool = WarmPool(self.runtime, snap, cfg, PoolConfig(size=self.per_task, max_live=self.max_live),
                            name=task.id[:40], registry=self.registry, label=f"source:{task.meta.source}")
            await pool.start(wait=False)
            self._pools[snap.id] = pool
            self._evict()
        self._pools.move_to_end(snap.id)
        sb = await pool.acquire()
        self._owner[sb.id] = pool
        return sb

    def release(self, sb: Sandbox) -> None:
        pool = self._owner.pop(sb.id, None)
        if pool is not None and not pool._closed:
            pool.release(sb)
        else:
            self._spawn(sb.close())

    def _evict(self) -> None:
        while len(self._pools) > self.max_pools:
            _, pool = next(iter(self._pools.items()))
            if pool._in_use:
                break
            self._pools.popitem(last=False)
            self.retired_hits += pool.hits
            self.retired_misses += pool.misses
            self._spawn(pool.close())

    def _spawn(self, coro) -> None:
        t = asyncio.ensure_future(coro)
        self._closing.add(t)
        t.add_done_callback(self._closing.discard)

    @property
    def hit_rate(self) -> float:
        hits = self.retired_hits + sum(p.hits for p in self._pools.values())
        total = hits + self.retired_misses + sum(p.misses for p in self._pools.values())
        return hits / total if total else 0.0

    async def close(self) -> None:
        pools, self._pools = list(self._pools.values()), OrderedDict()
        await asyncio.gather(*(p.close() for p in pools), return_exceptions=True)
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
