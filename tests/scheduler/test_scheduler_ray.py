"""The Ray engine on a real local multi-node Ray cluster (Ray's own cluster utilities)."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from ray_cluster import local_cluster
from tryloop.scheduler import (
    AdmissionConfig,
    EpisodeRequest,
    EpisodeState,
    RayConfig,
    RetryConfig,
    Scheduler,
    SchedulerConfig,
)
from tryloop.scheduler.sim import FixedLatencyInference, ModelledEpisode, SimConfig

pytestmark = pytest.mark.ray

WORLD = SimConfig(turns=(2, 3), tool_cpu_s=0.1, verify_cpu_s=0.1, provision_s=0.01)


@pytest.fixture(scope="module")
def cluster():
    with local_cluster(3) as (c, nodes):
        yield c, nodes


def ray_config(**kw) -> SchedulerConfig:
    return SchedulerConfig(engine="ray", ray=RayConfig(host_resource="sandbox_host", episodes_per_host=4),
                           retry=RetryConfig(backoff_base_s=0.1, quarantine_after=100),
                           admission=AdmissionConfig(adaptive=False, initial=64), **kw)


async def test_same_runner_same_results_on_ray_and_local(cluster):
    runner = ModelledEpisode(WORLD, FixedLatencyInference(0.05))
    requests = [EpisodeRequest(f"e{i}", f"t{i}") for i in range(24)]
    results = {}
    for engine in ("ray", "local"):
        cfg = ray_config() if engine == "ray" else SchedulerConfig(admission=AdmissionConfig(adaptive=False, initial=64))
        async with Scheduler(runner, cfg) as s:
            await s.submit_many(requests)
            mid: set[EpisodeState] = set()
            while s.queued or s.in_flight:                      # sample states while they run
                mid |= {s.status(r.id).state for r in requests}
                await asyncio.sleep(0.02)
            await s.drain()
            results[engine] = {o.id: o.result for o in s.outcomes()}
            hosts = {s.status(r.id).host for r in requests}
            if engine == "ray":
                assert EpisodeState.RUNNING in mid            # stages stream back while episodes run
                assert len(hosts) == 3                          # placed over every sandbox host
                assert all(o.stage_seconds.get("running", 0) > 0 for o in s.outcomes())
                assert s.summary()["capacity"]["execution"]
    assert results["ray"] == results["local"] and len(results["ray"]) == 24


async def test_a_node_dies_mid_run_its_episodes_are_rescheduled_none_lost_none_counted_twice(cluster):
    c, nodes = cluster
    runner = ModelledEpisode(WORLD, FixedLatencyInference(0.1))
    n = 60
    async with Scheduler(runner, ray_config()) as s:
        await s.submit_many(EpisodeRequest(f"e{i}", f"t{i}") for i in range(n))
        seen: Counter[str] = Counter()
        victim = nodes[0]
        killed = False
        async for outcome in s.results():
            seen[outcome.id] += 1
            if len(seen) == 15 and not killed:
                on_victim = [i for i in (f"e{j}" for j in range(n))
                             if s.status(i).state.active and s.status(i).host == f"ray-{victim.node_id[:12]}"]
                await asyncio.to_thread(c.remove_node, victim)
                killed = True
        outcomes = s.outcomes()
        summary = s.summary()
    assert killed and on_victim
    assert len(seen) == n and set(seen.values()) == {1}
    assert all(o.ok for o in outcomes) and summary["finished"] == {"done": n}
    rerun = {o.id for o in outcomes if o.attempts > 1}
    assert set(on_victim) <= rerun
    assert summary["retries"].get("infrastructure", 0) >= len(on_victim)
    assert all(s.status(i).failure is None for i in rerun)
    assert not summary["capacity"]["execution"][f"ray-{victim.node_id[:12]}"]["alive"]
