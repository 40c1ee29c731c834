"""The learning zone, measured for real: scripted policies through sandboxes and the verifier."""

from __future__ import annotations

import asyncio

import pytest

from tryloop.agent.config import EpisodeLimits
from tryloop.agent.environments import Environments
from tryloop.agent.scripted import DoNothing, Oracle
from tryloop.store.trajectories import TrajectoryStore
from tryloop.tasks.factory import build_functions
from tryloop.tasks.gate import GateConfig
from tryloop.tasks.store import TaskStore
from tryloop.tasks.zone import (
    Band,
    in_zone,
    measure,
    no_zone_message,
    zone_key,
    zone_run_id,
    zone_table,
)


@pytest.fixture(scope="module")
def fn_store(runtime, tmp_path_factory):
    root = tmp_path_factory.mktemp("zone")
    store = TaskStore(root / "store")
    asyncio.run(build_functions(runtime, store, root / "work", gate=GateConfig(k=1), eval_fraction=0.5,
                                per_family=2, families=["add-constant", "sum-list"]))
    return store, [store.get(e.fingerprint) for e in store.query(source="functions")]


def test_measure_records_counts_once_and_selects_the_band(runtime, fn_store, tmp_path):
    store, tasks = fn_store
    assert len(tasks) == 4

    async def run(policy, key):
        envs = Environments(runtime)
        try:
            return await measure(tasks, policy, envs, store, key=key, k=2, temperature=1.0,
                                 limits=EpisodeLimits(max_turns=2), trajectories=TrajectoryStore(tmp_path / "t"))
        finally:
            await envs.close()

    key = zone_key("oracle-weights", 1.0, 2)
    counts = asyncio.run(run(Oracle(), key))
    assert counts == {t.fingerprint(): (2, 2) for t in tasks}
    assert TrajectoryStore(tmp_path / "t").count(zone_run_id(key)) == 8
    assert store.pass_rates(tasks[0].fingerprint())[key] == {"passes": 2, "attempts": 2, "rate": 1.0}
    # Measured already: nothing runs again (a policy that would fail everything changes nothing).
    assert asyncio.run(run(DoNothing(), key)) == counts
    assert in_zone(tasks, counts, Band(0.05, 0.7)) == []            # always solved: out of the zone
    assert in_zone(tasks, counts, Band(0.5, 1.0)) == tasks

    never = asyncio.run(run(DoNothing(), zone_key("nothing", 1.0, 2)))
    assert set(never.values()) == {(0, 2)}
    mixed = {fp: (1, 2) for fp in never}
    rows = zone_table(tasks, mixed, Band())
    assert sum(r.tasks for r in rows) == 4 and all(r.in_zone == r.tasks for r in rows)
    assert {r.group for r in rows} == {"tier 1", "tier 2"}
    msg = no_zone_message(tasks, never, Band(), "do-nothing")
    assert "4 never solved" in msg and "train.zone_lo" in msg


def test_zone_samples_never_share_seeds_with_evaluations():
    from tryloop.tasks.zone import zone_seed

    key = zone_key("w", 0.7, 3)
    s = zone_seed(key, 0)
    # evaluate() seeds sample i of an evaluation of seed e with e * 1_000_003 + i.
    eval_seeds = {e * 1_000_003 + i for e in range(4) for i in range(8)}
    assert not {s * 1_000_003 + i for i in range(8)} & eval_seeds
    assert zone_seed(key, 0) == s and zone_seed(key, 1) != s
