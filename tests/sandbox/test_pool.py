"""WarmPool on a real runtime: filling, hits and misses, recycling, health, limits, close."""

from __future__ import annotations

import asyncio
import gc
import os
import time
import uuid

import pytest
from prometheus_client import CollectorRegistry

from tryloop.config import PoolConfig
from tryloop.errors import SandboxError
from tryloop.sandbox import WarmPool
from tryloop.sandbox.pool import PoolMetrics

# PoolMetrics caches metrics by id(registry); a freed registry's id can be reused by the
# next one (see test_metrics_follow_a_new_registry_with_a_reused_id), so every registry
# made here is kept alive for the whole module.
_REGISTRIES: list[CollectorRegistry] = []


@pytest.fixture
def registry() -> CollectorRegistry:
    r = CollectorRegistry()
    _REGISTRIES.append(r)
    return r


@pytest.fixture
def name() -> str:
    return f"pool-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def snap(runtime):
    return runtime.workspace_snapshot({"seed.txt": "seed\n"})


def sample(registry, metric: str, **labels) -> float:
    return registry.get_sample_value(metric, labels) or 0.0


async def until(cond, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.01)


async def quiesce(pool: WarmPool) -> None:
    """Let refills and recycles finish before close(): closing while a refill round is in
    flight leaks its sandboxes (see test_close_during_refill_leaks_nothing)."""
    for _ in range(3):
        await until(lambda: pool._creating == 0 and not pool._tasks)
        await asyncio.sleep(0.05)


async def test_fills_to_size(runtime, snap, small_config, registry, name):
    async with WarmPool(runtime, snap, small_config, PoolConfig(size=3), name=name, registry=registry) as pool:
        assert pool.idle == 3
        assert pool.live == 3
        assert sample(registry, "tryloop_pool_idle", pool=name) == 3
        assert sample(registry, "tryloop_pool_live", pool=name) == 3
        assert sample(registry, "tryloop_pool_create_seconds_count", pool=name) == 3
        for sb in list(pool._idle):
            assert sb.alive
            assert sb.snapshot == snap
            assert sb.read_file("seed.txt") == b"seed\n"


async def test_acquire_hit_and_miss_are_counted(runtime, snap, small_config, registry, name):
    cfg = PoolConfig(size=1, refill_concurrency=1)
    async with WarmPool(runtime, snap, small_config, cfg, name=name, registry=registry) as pool:
        a = await pool.acquire()  # the one pre-started sandbox: a hit
        assert (pool.hits, pool.misses) == (1, 0)
        # Take the refill too, then one more: that one has to be started on demand.
        await pool.wait_ready()
        b = await pool.acquire()
        c = await pool.acquire()
        assert pool.hits == 2
        assert pool.misses == 1
        assert sample(registry, "tryloop_pool_acquire_total", pool=name, result="hit") == 2
        assert sample(registry, "tryloop_pool_acquire_total", pool=name, result="miss") == 1
        assert sample(registry, "tryloop_pool_acquire_seconds_count", pool=name, result="hit") == 2
        assert sample(registry, "tryloop_pool_acquire_seconds_count", pool=name, result="miss") == 1
        assert len({a.id, b.id, c.id}) == 3
        for sb in (a, b, c):
            assert (await sb.exec("cat seed.txt")).text() == "seed\n"
            pool.release(sb)
        await quiesce(pool)


async def test_released_sandboxes_are_reset(runtime, snap, small_config, registry, name):
    # max_live=1: the very same sandbox must come back, reset.
    cfg = PoolConfig(size=1, max_live=1)
    async with WarmPool(runtime, snap, small_config, cfg, name=name, registry=registry) as pool:
        sb = await pool.acquire()
        sb.write_file("dirty.txt", "left by the previous user")
        await sb.exec("echo changed > seed.txt")
        bg = await sb.start(["sleep", "1000"])
        pool.release(sb)
        await pool.wait_ready()
        again = await pool.acquire()
        assert again is sb
        assert not again.files.exists("dirty.txt")
        assert again.read_file("seed.txt") == b"seed\n"
        assert (await bg.wait()).signal == 9
        assert sample(registry, "tryloop_pool_reset_seconds_count", pool=name) == 1
        pool.release(again)
        await quiesce(pool)


async def test_release_twice_or_foreign_is_refused(runtime, snap, small_config, registry, name):
    async with WarmPool(runtime, snap, small_config, PoolConfig(size=1), name=name, registry=registry) as pool:
        sb = await pool.acquire()
        pool.release(sb)
        with pytest.raises(SandboxError):
            pool.release(sb)
        async with await runtime.create(snap, small_config) as other:
            with pytest.raises(SandboxError):
                pool.release(other)
        await quiesce(pool)


async def test_unhealthy_sandbox_is_destroyed_not_reused(runtime, snap, small_config, registry, name):
    cfg = PoolConfig(size=1)
    async with WarmPool(runtime, snap, small_config, cfg, name=name, registry=registry) as pool:
        sb = await pool.acquire()
        os.kill(sb.init_pid, 9)
        await until(lambda: not sb.alive)
        pool.release(sb)
        await until(lambda: not pool._tasks)
        failures = sum(sample(registry, "tryloop_pool_failures_total", pool=name, reason=r)
                       for r in ("dead_on_release", "reset_failed", "dead_idle"))
        assert failures == 1
        assert sb.id not in runtime.cgroups.list_groups()
        assert sb not in runtime.live
        seen = []
        for _ in range(3):
            other = await pool.acquire()
            seen.append(other)
            assert other is not sb
            assert other.alive
            assert (await other.exec("cat seed.txt")).ok
        for other in seen:
            pool.release(other)
        await quiesce(pool)


async def test_dead_idle_sandbox_is_skipped(runtime, snap, small_config, registry, name):
    async with WarmPool(runtime, snap, small_config, PoolConfig(size=2), name=name, registry=registry) as pool:
        victim = pool._idle[0]
        os.kill(victim.init_pid, 9)
        await until(lambda: not victim.alive)
        sb = await pool.acquire()
        assert sb is not victim and sb.alive
        assert sample(registry, "tryloop_pool_failures_total", pool=name, reason="dead_idle") == 1
        pool.release(sb)
        await until(lambda: not pool._tasks)
        assert victim not in runtime.live
        await quiesce(pool)


async def test_max_live_is_enforced(runtime, snap, small_config, registry, name):
    cfg = PoolConfig(size=0, max_live=2)
    async with WarmPool(runtime, snap, small_config, cfg, name=name, registry=registry) as pool:
        a = await pool.acquire()
        b = await pool.acquire()
        assert pool.live == 2
        with pytest.raises(SandboxError, match="max_live"):
            await pool.acquire()
        pool.release(a)
        await until(lambda: pool.live < 2)
        c = await pool.acquire()
        assert c.alive
        pool.release(b)
        pool.release(c)
        await quiesce(pool)


async def test_refill_respects_max_live(runtime, snap, small_config, registry, name):
    cfg = PoolConfig(size=3, max_live=2)
    pool = WarmPool(runtime, snap, small_config, cfg, name=name, registry=registry)
    await pool.start(wait=False)
    try:
        await until(lambda: pool.idle == 2)
        await asyncio.sleep(0.3)
        assert pool.live == 2
        with pytest.raises(SandboxError):
            await pool.wait_ready(timeout=0.5)
    finally:
        await pool.close()


async def test_close_destroys_idle_and_in_use(runtime, snap, small_config, registry, name):
    pool = await WarmPool(runtime, snap, small_config, PoolConfig(size=2), name=name,
                          registry=registry).start()
    in_use = [await pool.acquire(), await pool.acquire()]
    running = await in_use[0].start(["sleep", "1000"])
    await pool.wait_ready()
    await quiesce(pool)
    idle = list(pool._idle)
    ids = {sb.id for sb in in_use + idle}
    assert len(ids) == 4
    await pool.close()
    assert all(not sb.alive for sb in in_use + idle)
    assert not ids & set(runtime.cgroups.list_groups())
    assert not ids & {sb.id for sb in runtime.live}
    assert not ids & {p.stem for p in runtime.records_dir.glob("*.json")}
    assert pool.live == 0
    assert sample(registry, "tryloop_pool_live", pool=name) == 0
    with pytest.raises(SandboxError):
        await running.wait()
    with pytest.raises(SandboxError):
        await pool.acquire()
    # Releasing after close destroys rather than recycles (and does not raise).
    await pool.close()


async def test_concurrent_acquire_release(runtime, snap, small_config, registry, name):
    cfg = PoolConfig(size=4)
    async with WarmPool(runtime, snap, small_config, cfg, name=name, registry=registry) as pool:
        holders: dict[str, int] = {}

        async def worker(i: int) -> None:
            for j in range(4):
                sb = await pool.acquire()
                assert sb.id not in holders, "one sandbox handed to two tasks"
                holders[sb.id] = i
                assert not sb.files.exists("mine.txt"), "state leaked from a previous user"
                sb.write_file("mine.txt", f"{i}-{j}")
                res = await sb.exec("cat mine.txt seed.txt")
                assert res.text() == f"{i}-{j}seed\n"
                del holders[sb.id]
                pool.release(sb)

        await asyncio.gather(*(worker(i) for i in range(16)))
        assert pool.hits + pool.misses == 64
        total = (sample(registry, "tryloop_pool_acquire_total", pool=name, result="hit")
                 + sample(registry, "tryloop_pool_acquire_total", pool=name, result="miss"))
        assert total == 64
        await quiesce(pool)
        assert pool.idle <= cfg.size
        assert sample(registry, "tryloop_pool_failures_total", pool=name, reason="reset_failed") == 0


async def test_metrics_follow_a_new_registry(runtime, snap, small_config, registry, name):
    """Two pools on two live registries each count only their own acquisitions."""
    other = CollectorRegistry()
    _REGISTRIES.append(other)
    async with WarmPool(runtime, snap, small_config, PoolConfig(size=1), name=name, registry=registry) as p1, \
            WarmPool(runtime, snap, small_config, PoolConfig(size=1), name=name, registry=other) as p2:
        p1.release(await p1.acquire())
        assert sample(registry, "tryloop_pool_acquire_total", pool=name, result="hit") == 1
        assert sample(other, "tryloop_pool_acquire_total", pool=name, result="hit") == 0
        p2.release(await p2.acquire())
        assert sample(other, "tryloop_pool_acquire_total", pool=name, result="hit") == 1
        await quiesce(p1)
        await quiesce(p2)


async def _leaks_of_a_pool_closed_mid_refill(runtime, snap, small_config, registry, name, *, size: int,
                                             cancel_refill: bool) -> list:
    """Start a pool without waiting, close it as soon as the first sandbox of its refill round
    exists (polling every loop turn), first cancelling the round if asked; the sandboxes left."""
    before = {sb.id for sb in runtime.live}
    pool = WarmPool(runtime, snap, small_config, PoolConfig(size=size, refill_concurrency=size), name=name,
                    registry=registry)
    await pool.start(wait=False)
    try:
        while not {sb.id for sb in runtime.live} - before:
            await asyncio.sleep(0)
        if cancel_refill:
            pool._refiller.cancel()
            await asyncio.gather(pool._refiller, return_exceptions=True)
        await pool.close()
        return [sb for sb in runtime.live if sb.id not in before]
    finally:
        for sb in runtime.live:
            if sb.id not in before:
                await sb.close()


async def test_close_during_refill_leaks_nothing(runtime, snap, small_config, registry, name):
    assert not await _leaks_of_a_pool_closed_mid_refill(runtime, snap, small_config, registry, name, size=2,
                                                        cancel_refill=False)


async def test_a_refill_cancelled_mid_round_leaks_nothing(runtime, snap, small_config, registry, name):
    """What close does to a refill stuck past its wait: the sandboxes of the round that were already
    made are destroyed with the pool, not dropped with the cancelled round."""
    assert not await _leaks_of_a_pool_closed_mid_refill(runtime, snap, small_config, registry, name, size=3,
                                                        cancel_refill=True)


def test_metrics_follow_a_new_registry_with_a_reused_id():
    for _ in range(20):
        r = CollectorRegistry()
        PoolMetrics.for_registry(r).live.labels("reuse").set(1)
        assert r.get_sample_value("tryloop_pool_live", {"pool": "reuse"}) == 1
        del r
        gc.collect()


async def test_pools_sharing_a_label_add_up_and_leave_nothing_when_closed(runtime, snap, small_config, registry,
                                                                           name):
    """A pool per task labelled by the task's source: the label's gauges are the sum of its pools,
    and each pool takes back what it added when it closes."""
    def live() -> float:
        return sample(registry, "tryloop_pool_live", pool=name)

    one = WarmPool(runtime, snap, small_config, PoolConfig(size=1), name="task-a", registry=registry, label=name)
    two = WarmPool(runtime, snap, small_config, PoolConfig(size=2), name="task-b", registry=registry, label=name)
    await one.start()
    await two.start()
    try:
        assert live() == 3 and sample(registry, "tryloop_pool_idle", pool=name) == 3
        sb = await two.acquire()
        await quiesce(two)                 # its refill replaces the sandbox handed out
        assert two.live == 3 and live() == 4 and sample(registry, "tryloop_pool_idle", pool=name) == 3
        assert sample(registry, "tryloop_pool_acquire_total", pool=name, result="hit") == 1
        assert registry.get_sample_value("tryloop_pool_live", {"pool": "task-b"}) is None   # no series per pool
        await quiesce(one)
        await one.close()
        assert live() == two.live == 3
        two.release(sb)
        await until(lambda: not two._resetting and not two._tasks)
        assert live() == two.live and sample(registry, "tryloop_pool_idle", pool=name) == two.idle
    finally:
        await quiesce(two)
        await two.close()
        await one.close()
    assert live() == 0 and sample(registry, "tryloop_pool_idle", pool=name) == 0
