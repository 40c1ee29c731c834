"""`tryloop.bench.scheduler` runs end to end with tiny numbers. No timing assertions beyond sanity:
the figures depend on the machine."""

from __future__ import annotations

import json

import pytest

from tryloop.bench.scheduler import (
    max_concurrent,
    overhead_per_episode,
    ray_vs_local,
    simulated_admission,
)
from tryloop.scheduler.sim import SimConfig


def test_overhead_and_concurrency_measure_something_plausible():
    overhead = overhead_per_episode(500)
    assert 0 < overhead["us_per_episode"] < 100_000 and overhead["us_per_episode_journaled"] > 0
    conc = max_concurrent((50, 200), inference_s=0.05, tool_s=0.02, max_stretch=100)
    assert conc["max_concurrent_sustained"] == 200
    assert [s["peak_in_flight"] for s in conc["steps"]] == [50, 200]
    json.dumps(conc)


def test_simulated_admission_reports_every_run():
    out = simulated_admission(SimConfig(gpus=2, episodes=200, sandbox_slots=32, turns=(2, 4)), fixed_limits=(200,))
    assert set(out["table"]) == {"adaptive", "fixed_200"}
    for row in out["table"].values():
        assert 0 <= row["gpu_idle_share"] <= 1 and 0 <= row["sandbox_idle_share"] <= 1
    json.dumps(out)


@pytest.mark.slow
@pytest.mark.ray
def test_ray_vs_local_ratio():
    out = ray_vs_local(60)
    assert out["local_episodes_per_s"] > 0 and out["ray_episodes_per_s"] > 0 and out["ray_over_local"] > 0
