"""Simulation mode: the real scheduler on virtual time with modelled GPUs and sandboxes."""

from __future__ import annotations

import asyncio
import time

import pytest

from tryloop.scheduler import (
    AdmissionConfig,
    EpisodeRequest,
    Scheduler,
    SchedulerConfig,
    TimeoutConfig,
)
from tryloop.scheduler.sim import SimConfig, simulate
from tryloop.scheduler.vclock import run_virtual


def test_virtual_time_runs_sleeps_and_timeouts_without_waiting():
    async def main():
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await asyncio.gather(*(asyncio.sleep(s) for s in (10, 3600, 50)))
        slept = loop.time() - t0
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(5):
                await asyncio.sleep(100)
        return slept, loop.time() - t0

    wall = time.perf_counter()
    slept, total = run_virtual(main())
    assert slept == pytest.approx(3600) and total == pytest.approx(3605)
    assert time.perf_counter() - wall < 1


def test_the_scheduler_enforces_hour_long_deadlines_in_virtual_time():
    async def runner(request, ctx):
        await asyncio.sleep(7200 if request.id == "stuck" else 60)     # two hours vs a minute
        return "ok"

    async def main():
        cfg = SchedulerConfig(timeouts=TimeoutConfig(episode_s=3600))
        async with Scheduler(runner, cfg) as s:
            await s.submit_many([EpisodeRequest("stuck", "t"), EpisodeRequest("fine", "t")])
            await s.drain()
            return s.outcome("stuck"), s.outcome("fine"), asyncio.get_running_loop().time()

    wall = time.perf_counter()
    stuck, fine, now = run_virtual(main())
    assert stuck.failure.type == "EpisodeTimeout" and fine.ok
    assert stuck.stage_seconds["total"] == pytest.approx(3600, rel=1e-3)
    assert time.perf_counter() - wall < 2


SMALL = SimConfig(gpus=2, episodes=300, sandbox_slots=32, turns=(2, 6), kv_tokens=100_000)


def test_a_small_simulation_is_fast_deterministic_and_accounts_for_every_episode():
    adaptive = AdmissionConfig(adaptive=True, initial=8, max=300)
    a = simulate(SMALL, adaptive)
    b = simulate(SMALL, adaptive)
    assert a["episodes_done"] == 300
    assert a["wall_s"] < 15 and a["makespan_s"] > 20 * a["wall_s"]       # virtual time runs far ahead
    for key in ("gpu_idle_share", "sandbox_idle_share", "gpu_prefill_share", "decode_share_of_peak"):
        assert 0 <= a[key] <= 1, key
    a.pop("wall_s"), b.pop("wall_s")
    assert a == b
    assert a["admission_limit"]["max"] > 8                              # it grew from its initial limit


def test_admitting_everything_thrashes_the_kv_cache_and_adaptive_admission_does_not():
    world = SimConfig(gpus=4, episodes=800, sandbox_slots=64)
    everything = simulate(world, AdmissionConfig(adaptive=False, initial=800, max=800))
    adaptive = simulate(world, AdmissionConfig(adaptive=True, initial=8, max=800))
    # More episodes than the KV cache can hold: contexts are evicted and re-prefilled every turn.
    assert everything["gpu_recompute_share"] > 2 * adaptive["gpu_recompute_share"]
    assert adaptive["episodes_per_hour"] > 1.1 * everything["episodes_per_hour"]
    assert adaptive["sandbox_idle_share"] < everything["sandbox_idle_share"]


@pytest.mark.slow
def test_64_gpus_and_10000_concurrent_episodes():
    report = simulate(SimConfig(gpus=64, episodes=10_000), AdmissionConfig(adaptive=False, initial=10_000, max=10_000))
    assert report["episodes_done"] == 10_000 and report["peak_concurrent_episodes"] == 10_000
    assert report["wall_s"] < 180
