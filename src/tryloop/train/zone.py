"""The learning zone of the policy a train run starts from: its key, and a measurement on its own.

`tryloop train` measures the zone of its own source before its first step (train/run.py);
`tryloop tasks zone` measures any source with the same policy, temperature, k and episode setup,
so a user can see which families and tiers a model can learn from before training on them.
Both use `zone_key_for`, so a measurement made by one is reused by the other.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tryloop.config import TryloopConfig
from tryloop.tasks.model import Task
from tryloop.tasks.zone import Band, ZoneRow, tier_of, zone_key, zone_table
from tryloop.train.run_config import TrainRunConfig


def zone_key_for(tcfg: TrainRunConfig, weights_version: str) -> str:
    """The store's pass-rate key of `tcfg`'s zone: weights, temperature, k and the episode setup
    (limits, prompts, seed), since a pass rate holds only for the setup it was measured in."""
    from tryloop.agent.episode import ANSWER_ONLY_PROMPT, SYSTEM_PROMPT

    setup = json.dumps([tcfg.limits.model_dump(mode="json"), SYSTEM_PROMPT, ANSWER_ONLY_PROMPT,
                        "zone-seed-v2", zone_seed_of(tcfg)])
    return zone_key(weights_version, zone_temperature_of(tcfg), tcfg.zone_k, setup)


def zone_seed_of(tcfg: TrainRunConfig) -> int:
    return tcfg.seed if tcfg.zone_seed is None else tcfg.zone_seed


def zone_temperature_of(tcfg: TrainRunConfig) -> float:
    """The temperature the zone's pass rates are measured at: the training temperature unless pinned
    (a zone measured at T holds the tasks learnable at T; pinning it keeps one task set while
    another training temperature is tried)."""
    return tcfg.policy.temperature if tcfg.zone_temperature is None else tcfg.zone_temperature


def sampler_policy(loaded, tcfg: TrainRunConfig, engine=None):
    """The policy episodes are sampled from (the same for the zone, the rollouts and evaluations);
    `engine`: an `EndpointSampler` (train.sampler.endpoints) instead of the in-process engine."""
    from tryloop.agent.hf_policy import HFPolicy

    return HFPolicy(loaded, temperature=tcfg.policy.temperature, top_p=tcfg.policy.top_p,
                    max_new_tokens=tcfg.limits.max_new_tokens, max_context=tcfg.limits.max_context_tokens,
                    max_batch=tcfg.policy.max_batch, dtype=tcfg.policy.dtype, cpu_kernels=tcfg.policy.cpu_kernels, engine=engine,
                    multi_turn=tcfg.limits.max_turns > 1)


def sampler_api_key(tcfg: TrainRunConfig) -> str | None:
    """The samplers' bearer token, from the variable train.sampler.api_key_env names (None: no token)."""
    import os

    from tryloop.errors import ConfigError

    env = tcfg.sampler.api_key_env
    if not env:
        return None
    key = os.environ.get(env, "")
    if not key:
        raise ConfigError(f"train.sampler.api_key_env: the environment variable {env} is unset or empty")
    return key


def endpoint_sampler(tcfg: TrainRunConfig, loaded=None, *, endpoints: list[str] | None = None, **overrides):
    """An `EndpointSampler` (not yet connected) over `endpoints` (default: train.sampler.endpoints)
    with train.sampler's settings, `overrides` taking precedence (a rollout worker names its
    endpoints, kind and key, which the trainer read); None for no endpoints: the in-process
    engine."""
    from tryloop.agent.endpoints import EndpointSampler

    sc = tcfg.sampler
    urls = sc.endpoints if endpoints is None else endpoints
    if not urls:
        return None
    api_key = overrides.pop("api_key") if "api_key" in overrides else sampler_api_key(tcfg)
    # Overlapped rollouts sample across pushes: the trainer checks each episode's versions instead.
    kw = {"kind": sc.kind, "timeout_s": sc.timeout_s, "retries": sc.retries, "weights_dir": sc.weights_dir,
          "down_s": sc.down_s, "model_config": getattr(getattr(loaded, "model", None), "config", None),
          "check_versions": not tcfg.overlap, **overrides}
    return EndpointSampler(urls, api_key=api_key, **kw)


def by_family(task: Task) -> str:
    return f"{task.meta.family} / {tier_of(task)}"


@dataclass
class ZoneMeasurement:
    key: str
    band: Band
    tasks: list[Task]
    counts: dict[str, tuple[int, int]]     # fingerprint -> (passes, attempts)
    seconds: float

    def rows(self, by: Callable[[Task], str] = tier_of) -> list[ZoneRow]:
        return zone_table(self.tasks, self.counts, self.band, by=by)


async def measure_zone(cfg: TryloopConfig, tcfg: TrainRunConfig, tasks: list[Task], *,
                       on_done: Callable[[Any], None] | None = None,
                       on_start: Callable[[int, int], None] | None = None) -> ZoneMeasurement:
    """k samples per task not yet measured under this policy and setup (kept in the task store)."""
    import torch

    from tryloop.agent.environments import Environments
    from tryloop.agent.hf import load_model
    from tryloop.eval.scheduled import ScheduledRunner, bounded
    from tryloop.sandbox import SandboxRuntime
    from tryloop.store.trajectories import TrajectoryStore
    from tryloop.tasks.store import TaskStore
    from tryloop.tasks.zone import measure

    loaded = load_model(tcfg.policy.name, device=tcfg.policy.device)
    if tcfg.rollout_threads and loaded.device.type == "cpu":
        torch.set_num_threads(tcfg.rollout_threads)
    key = zone_key_for(tcfg, loaded.weights_version)
    t0 = time.perf_counter()
    counts = await measure(tasks, sampler_policy(loaded, tcfg), Environments(SandboxRuntime(cfg.runtime)),
                           TaskStore(cfg.tasks.store_url), key=key, k=tcfg.zone_k,
                           temperature=zone_temperature_of(tcfg), limits=tcfg.limits,
                           runner=ScheduledRunner(bounded(cfg.scheduler, tcfg.concurrency)), spec=cfg.rewards.spec,
                           trajectories=TrajectoryStore(cfg.store.trajectories_url), seed=zone_seed_of(tcfg),
                           on_done=on_done, on_start=on_start)
    return ZoneMeasurement(key, Band(tcfg.zone_lo, tcfg.zone_hi), tasks, counts, time.perf_counter() - t0)
