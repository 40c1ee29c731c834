"""benchmarks/scaling_sim.py (the figures in docs/scaling.md) runs and writes its table for a small GPU count."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "scaling_sim.py"


def _load():
    spec = importlib.util.spec_from_file_location("scaling_sim", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_scaling_sim_runs_small_and_is_deterministic(tmp_path):
    mod = _load()
    a = mod.run(gpus=(2,), slots_per_gpu=(4, 8), episodes_per_gpu=10)
    assert [(r["gpus"], r["sandbox_slots"]) for r in a["rows"]] == [(2, 8), (2, 16)]
    for r in a["rows"]:
        assert r["episodes"] == 20
        assert r["raw"]["episodes_done"] == 20
        assert r["episodes_per_hour"] > 0
        assert 0 <= r["gpu_busy_share"] <= 1
    table = mod.table(a)
    assert table.count("\n") == 3
    b = mod.run(gpus=(2,), slots_per_gpu=(4, 8), episodes_per_gpu=10)
    strip = lambda res: [{k: v for k, v in r.items() if k != "wall_s" and k != "raw"} for r in res["rows"]]  # noqa: E731
    assert strip(a) == strip(b)
    json.dumps(a)
