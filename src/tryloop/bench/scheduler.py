"""`tryloop bench scheduler`: what the scheduler costs and how far it scales.

  (a) `overhead_per_episode`   the scheduler's own cost: a no-op runner, µs per episode
                               (with and without the fsynced journal);
  (b) `max_concurrent`         the most episodes one process keeps in flight at once with a
                               scripted policy and modelled environment (asyncio sleeps), found by
                               stepping up until the event loop falls behind;
  (c) `ray_vs_local`           throughput of the Ray engine over the local engine on this machine,
                               same runner and config;
  (d) `simulated_admission`    simulated GPU-idle and sandbox-idle shares with adaptive admission
                               and with fixed limits (`tryloop.scheduler.sim`, virtual time).

Every function returns a plain dict; `run` runs all four.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from tryloop.scheduler import (
    AdmissionConfig,
    CapacityConfig,
    EpisodeRequest,
    Scheduler,
    SchedulerConfig,
    TimeoutConfig,
)
from tryloop.scheduler.sim import FixedLatencyInference, ModelledEpisode, SimConfig, simulate


def _fixed(limit: int, **kw: Any) -> SchedulerConfig:
    return SchedulerConfig(admission=AdmissionConfig(adaptive=False, initial=limit, max=max(limit, 10_000)),
                           max_queued=max(limit, 100_000), **kw)


async def _noop(request: EpisodeRequest, ctx: Any) -> None:
    return None


# ---- (a) overhead ---------------------------------------------------------------------------

async def _overhead(episodes: int, journal: Path | None) -> float:
    cfg = _fixed(1024, journal=journal)
    async with Scheduler(_noop, cfg) as s:
        t = time.perf_counter()
        await s.submit_many(EpisodeRequest(f"e{i}", f"t{i % 100}") for i in range(episodes))
        await s.drain()
        return time.perf_counter() - t


def overhead_per_episode(episodes: int = 20_000) -> dict[str, Any]:
    """Submit, dispatch, run (a runner that returns at once) and record `episodes` episodes."""
    plain = asyncio.run(_overhead(episodes, None))
    with tempfile.TemporaryDirectory(prefix="tryloop-bench-sched-") as tmp:
        journaled = asyncio.run(_overhead(episodes, Path(tmp) / "journal.jsonl"))
    return {"episodes": episodes,
            "us_per_episode": round(plain / episodes * 1e6, 1),
            "us_per_episode_journaled": round(journaled / episodes * 1e6, 1),
            "episodes_per_s": round(episodes / plain, 1)}


# ---- (b) concurrency ------------------------------------------------------------------------

async def _concurrency(n: int, inference_s: float, tool_s: float) -> dict[str, Any]:
    world = SimConfig(turns=(3, 3), tool_cpu_s=tool_s, verify_cpu_s=tool_s, provision_s=tool_s / 5)
    runner = ModelledEpisode(world, FixedLatencyInference(inference_s))
    # Capacity never binds here: the question is what the process sustains, not the GPUs.
    cfg = _fixed(n, local_hosts={"modelled": n}, timeouts=TimeoutConfig(inference_s=None),
                 capacity=CapacityConfig(inference_per_endpoint=n))
    lags: list[float] = []
    peak = 0
    loop = asyncio.get_running_loop()
    async with Scheduler(runner, cfg) as s:
        async def watch() -> None:
            nonlocal peak
            while True:
                t = loop.time()
                await asyncio.sleep(0.05)
                lags.append(loop.time() - t - 0.05)
                peak = max(peak, s.in_flight)

        watcher = asyncio.create_task(watch())
        t = time.perf_counter()
        await s.submit_many(EpisodeRequest(f"e{i}", f"t{i % 100}") for i in range(n))
        await s.drain()
        wall = time.perf_counter() - t
        watcher.cancel()
        running = s.summary()["stage_seconds"]["running"]["p50"]
    lags.sort()
    return {"episodes": n, "peak_in_flight": peak, "wall_s": round(wall, 2), "episode_s_p50": round(running, 4),
            "modelled_episode_s_mean": 3 * inference_s + 4 * tool_s,
            "loop_lag_p50_ms": round(statistics.median(lags) * 1e3, 1) if lags else None,
            "loop_lag_p99_ms": round(lags[int(len(lags) * 0.99)] * 1e3, 1) if lags else None}


def max_concurrent(steps: tuple[int, ...] = (1_000, 10_000, 20_000, 40_000), *, inference_s: float = 2.0,
                   tool_s: float = 0.5, max_stretch: float = 1.5) -> dict[str, Any]:
    """Step up the number of concurrent episodes (all admitted at once, each 3 turns of
    `inference_s` generation and tool calls of `tool_s` on average) until the median episode takes more than
    `max_stretch` times what it took at the first (small) step: past that point the process, not
    the modelled work, sets the pace. Reports the largest step that held."""
    rows = []
    best = 0
    baseline: float | None = None
    for n in steps:
        row = asyncio.run(_concurrency(n, inference_s, tool_s))
        baseline = baseline or row["episode_s_p50"]
        row["stretch"] = round(row["episode_s_p50"] / baseline, 3)
        row["sustained"] = row["peak_in_flight"] == n and row["stretch"] <= max_stretch
        rows.append(row)
        if not row["sustained"]:
            break
        best = n
    return {"max_concurrent_sustained": best,
            "criterion": f"all in flight at once, median episode <= {max_stretch}x its time at {steps[0]} episodes",
            "steps": rows}


# ---- (c) Ray vs local -----------------------------------------------------------------------

async def _throughput(cfg: SchedulerConfig, runner: Any, episodes: int, warmup: int) -> float:
    async with Scheduler(runner, cfg) as s:
        # Warm up first: Ray starts its worker processes lazily, and that is not throughput.
        await s.submit_many(EpisodeRequest(f"w{i}", "warm") for i in range(warmup))
        await s.drain()
        t = time.perf_counter()
        await s.submit_many(EpisodeRequest(f"e{i}", f"t{i % 100}") for i in range(episodes))
        await s.drain()
        return episodes / (time.perf_counter() - t)


def ray_vs_local(episodes: int = 500, *, inference_s: float = 0.02, concurrency: int = 64) -> dict[str, Any]:
    """Episodes per second of the same short modelled runner (2 turns of `inference_s`, tool calls
    of ~10 ms) on both engines, `concurrency` episodes at a time (Ray: a local single-node
    instance on this machine's CPUs, one rollout worker)."""
    import ray

    from tryloop.scheduler import RayConfig

    world = SimConfig(turns=(2, 2), tool_cpu_s=0.01, verify_cpu_s=0.01, provision_s=0.0)
    runner = ModelledEpisode(world, FixedLatencyInference(inference_s))
    # Execution slots that never bind: the engines, not this machine's two CPU slots, are measured.
    capacity = CapacityConfig(execution_slots=concurrency)
    local = asyncio.run(_throughput(_fixed(concurrency, capacity=capacity), runner, episodes, 20))
    started = not ray.is_initialized()
    if started:
        ray.init(include_dashboard=False, log_to_driver=False)
    try:
        cfg = _fixed(concurrency, engine="ray", ray=RayConfig(episodes_per_host=concurrency), capacity=capacity)
        remote = asyncio.run(_throughput(cfg, runner, episodes, 20))
    finally:
        if started:
            ray.shutdown()
    return {"episodes": episodes, "local_episodes_per_s": round(local, 1), "ray_episodes_per_s": round(remote, 1),
            "ray_over_local": round(remote / local, 3), "ray_version": ray.__version__}


# ---- (d) simulated admission ----------------------------------------------------------------

def simulated_admission(world: SimConfig | None = None, *, fixed_limits: tuple[int, ...] = ()) -> dict[str, Any]:
    """GPU and sandbox idle shares, throughput and KV-cache recompute for adaptive admission and
    for fixed limits (by default: everything admitted at once, and the adaptive run's initial
    limit), on the modelled world (default: 64 GPUs, 10,000 episodes).

    `gpu_idle_share`: GPU time with nothing to decode or prefill. `gpu_unproductive_share`: that
    plus time re-prefilling contexts the KV cache had evicted (work that only over-admission
    causes). `_to_90pct`: the same up to the moment 90% of episodes had ended, leaving out the
    drain at the end of a finite batch."""
    world = world or SimConfig()
    adaptive = AdmissionConfig(adaptive=True, initial=64, max=world.episodes)
    limits = fixed_limits or (world.episodes, adaptive.initial)
    runs = {"adaptive": simulate(world, adaptive)}
    for n in limits:
        runs[f"fixed_{n}"] = simulate(world, AdmissionConfig(adaptive=False, initial=n, max=max(n, world.episodes)))
    keys = ("episodes_per_hour", "gpu_idle_share", "gpu_recompute_share", "gpu_unproductive_share",
            "decode_share_of_peak", "sandbox_idle_share", "peak_concurrent_episodes", "makespan_s", "wall_s")
    table = {}
    for name, r in runs.items():
        row = {k: r[k] for k in keys}
        steady = r["until_90pct_done"]
        row.update({f"{k}_to_90pct": steady.get(k) for k in ("gpu_idle_share", "gpu_unproductive_share",
                                                             "sandbox_idle_share")})
        table[name] = row
    return {"world": world.model_dump(), "runs": runs, "table": table}


def run(*, quick: bool = False) -> dict[str, Any]:
    """All four measurements; `quick` shrinks each to seconds (for smoke tests)."""
    if quick:
        return {
            "overhead": overhead_per_episode(2_000),
            "concurrency": max_concurrent((500, 2_000), inference_s=0.5, tool_s=0.1),
            "ray_vs_local": ray_vs_local(100),
            "admission": simulated_admission(SimConfig(gpus=4, episodes=800, sandbox_slots=64)),
        }
    return {
        "overhead": overhead_per_episode(),
        "concurrency": max_concurrent(),
        "ray_vs_local": ray_vs_local(),
        "admission": simulated_admission(),
    }
