"""The learning zone: tasks a policy solves sometimes, measured, not guessed.

GRPO learns only from groups whose rewards differ. A task the policy never
solves (or always solves) gives all-equal groups, so a suite for a given
policy is the set of tasks whose pass rate under that policy, sampled at the
training temperature, lies in a band (default 5-70 %).

`measure` runs k episodes per task at the given temperature through the normal
episode path (sandbox, verifier) and records the counts in the task store under
a key naming the policy's weights, the temperature and k (`zone_key`). The
episodes are stored under a run id derived from that key, so an interrupted
measurement continues where it stopped and a finished one is never rerun.
These samples are independent of any later before/after evaluation: which
held-out tasks are in the zone is decided before, and apart from, the
evaluations that judge learning (no regression to the mean passed off as
learning).
"""

from __future__ import annotations

import hashlib
import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tryloop.agent.trajectory import Trajectory
from tryloop.tasks.model import Task


def zone_key(weights_version: str, temperature: float, k: int, setup: str = "") -> str:
    """The store's pass-rate key of one measurement: policy weights, temperature, samples, and a
    digest of the episode setup (`setup`, e.g. the limits and the prompt version), since a pass rate
    holds only for the setup it was measured in."""
    tail = f":{hashlib.sha256(setup.encode()).hexdigest()[:8]}" if setup else ""
    return f"zone:{weights_version}:T{temperature:g}:k{k}{tail}"


def zone_seed(key: str, seed: int) -> int:
    """The measurement's sampling seed: drawn from the key, so its episodes never share a seed (and
    so, with the same weights, never share their samples) with an evaluation of seed `seed`."""
    # 3 bytes: the episode seeds derived from it (x 1,000,003, then x 7,919 per turn) stay below 2**63.
    return int.from_bytes(hashlib.sha256(f"zone:{seed}:{key}".encode()).digest()[:3], "big") + 1_000


def zone_run_id(key: str) -> str:
    return "zone-" + hashlib.sha256(key.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Band:
    lo: float = 0.05
    hi: float = 0.70

    def contains(self, rate: float | None) -> bool:
        return rate is not None and self.lo <= rate <= self.hi


def measured(store, task: Task, key: str) -> dict[str, Any] | None:
    return store.pass_rates(task.fingerprint()).get(key)


async def measure(tasks: list[Task], policy, envs, store, *, key: str, k: int, temperature: float, limits,
                  runner=None, spec=None, trajectories=None, seed: int = 0,
                  on_done: Callable[[Trajectory], None] | None = None,
                  on_start: Callable[[int, int], None] | None = None) -> dict[str, tuple[int, int]]:
    """k episodes per task not yet measured under `key`; returns {fingerprint: (passes, attempts)} of
    every task (measured now or before). Episodes without a verdict are not counted."""
    from tryloop.agent.policy import sampling_temperature
    from tryloop.eval.config import EvalConfig
    from tryloop.eval.run import evaluate

    todo = [t for t in tasks if measured(store, t, key) is None]
    if todo:
        with sampling_temperature(policy, temperature):
            res = await evaluate(todo, policy, envs, cfg=EvalConfig(k=k, seed=zone_seed(key, seed), limits=limits),
                                 run_id=zone_run_id(key), store=trajectories, runner=runner, spec=spec,
                                 on_done=on_done, on_start=on_start)
        counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for t in res.trajectories:
            if t.verdict in ("pass", "fail"):
                c = counts[t.task_fingerprint]
                c[0] += t.verdict == "pass"
                c[1] += 1
        for t in todo:
            p, n = counts.get(t.fingerprint(), (0, 0))
            if n:
                store.record_pass_rate(t.fingerprint(), key, p, n)
    out = {}
    for t in tasks:
        m = measured(store, t, key)
        if m is not None:
            out[t.fingerprint()] = (m["passes"], m["attempts"])
    return out


def in_zone(tasks: list[Task], counts: dict[str, tuple[int, int]], band: Band) -> list[Task]:
    return [t for t in tasks if (c := counts.get(t.fingerprint())) and c[1] and band.contains(c[0] / c[1])]


def tier_of(task: Task) -> str:
    tier = task.meta.origin.get("tier")
    return f"tier {tier}" if tier is not None else task.meta.source


@dataclass
class ZoneRow:
    group: str              # "<family or source> / <tier>"
    split: str
    tasks: int
    measured: int
    mean_rate: float | None
    never: int              # rate 0
    always: int             # rate 1
    in_zone: int


def zone_table(tasks: list[Task], counts: dict[str, tuple[int, int]], band: Band,
               by: Callable[[Task], str] = tier_of) -> list[ZoneRow]:
    """Per group (tier by default, or family) and split: how many tasks reach the zone."""
    groups: dict[tuple[str, str], list[Task]] = defaultdict(list)
    for t in tasks:
        groups[(by(t), t.meta.split or "-")].append(t)
    rows = []
    for (g, split), ts in sorted(groups.items()):
        rates = [c[0] / c[1] for t in ts if (c := counts.get(t.fingerprint())) and c[1]]
        rows.append(ZoneRow(g, split, len(ts), len(rates), statistics.fmean(rates) if rates else None,
                            sum(r == 0 for r in rates), sum(r == 1 for r in rates),
                            sum(band.contains(r) for r in rates)))
    return rows


def no_zone_message(tasks: list[Task], counts: dict[str, tuple[int, int]], band: Band, policy: str) -> str:
    rates = [c[0] / c[1] for t in tasks if (c := counts.get(t.fingerprint())) and c[1]]
    never = sum(r == 0 for r in rates)
    always = sum(r == 1 for r in rates)
    return (f"no task is in the learning zone of {policy} ({band.lo:.0%}-{band.hi:.0%} pass rate): measured "
            f"{len(rates)} of {len(tasks)} tasks, {never} never solved, {always} always solved, mean pass rate "
            f"{statistics.fmean(rates) if rates else 0:.1%}. Try easier tasks (train.source: functions), a "
            f"stronger policy, more samples per task (train.zone_k), a higher temperature, or a wider band "
            f"(train.zone_lo / train.zone_hi).")
