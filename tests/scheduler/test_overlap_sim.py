"""The simulator's learner: synchronous and overlapped training steps, and its presets in
tryloop.bench.train (`tryloop bench train --sim-only`, benchmarks/overlap_sim.py)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tryloop.bench import train as bench
from tryloop.scheduler import AdmissionConfig
from tryloop.scheduler.sim import (
    LearnerConfig,
    ModelledInference,
    SimConfig,
    compare_training,
    simulate_training,
)
from tryloop.scheduler.vclock import run_virtual

SMALL = SimConfig(gpus=2, sandbox_slots=32, turns=(2, 6), kv_tokens=100_000)
FIXED = AdmissionConfig(adaptive=False, initial=64, max=64)
STEPS = LearnerConfig(steps=5, tasks_per_step=4, group_size=8, update_s=60.0, push_s=5.0)
SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "overlap_sim.py"


def _accounted(r: dict, learner: LearnerConfig) -> None:
    """Every step consumed exactly its episodes, each once; every run was consumed or dropped."""
    want = learner.steps * learner.episodes_per_step
    assert r["episodes_consumed"] == want
    assert sum(r["staleness"]["histogram"].values()) == want
    assert r["episodes_run"] == want + r["stale_dropped"]


@pytest.mark.parametrize(("k", "ahead"), [(0, 1), (1, 1), (1, 2), (2, 2)])
def test_overlap_never_trains_beyond_the_staleness_bound(k, ahead):
    learner = STEPS.model_copy(update={"overlap": True, "max_staleness": k, "ahead": ahead})
    r = simulate_training(SMALL, learner, FIXED)
    assert r["staleness"]["max"] <= k
    assert all(int(v) <= k for v in r["staleness"]["histogram"])
    _accounted(r, learner)
    if ahead > k:     # episodes started before the push they needed: dropped and sampled again
        assert r["stale_dropped"] > 0
    else:
        assert r["stale_dropped"] == 0
        assert r["staleness"]["max"] == k    # the next step's episodes did start before the push


def test_synchronous_steps_are_never_stale():
    r = simulate_training(SMALL, STEPS, FIXED)
    assert r["mode"] == "synchronous"
    assert r["staleness"] == {"histogram": {"0": STEPS.steps * STEPS.episodes_per_step}, "max": 0, "mean": 0.0}
    assert r["stale_dropped"] == 0
    _accounted(r, STEPS)
    # Nothing samples during the update: the step interval is rollout, update and push.
    assert r["step_interval_s"]["p50"] >= r["rollout_wall_s"]["p50"] + STEPS.update_s + STEPS.push_s - 1e-6


def test_without_update_or_push_the_two_modes_take_the_same_time():
    learner = STEPS.model_copy(update={"update_s": 0.0, "push_s": 0.0})
    r = compare_training(SMALL, learner, FIXED)
    assert r["synchronous"]["makespan_s"] == pytest.approx(r["overlapped"]["makespan_s"], rel=0.01)
    assert r["overlapped"]["staleness"]["max"] == 0    # the next rollout starts after the (instant) push


def test_overlap_hides_a_long_update_behind_the_next_rollout():
    r = compare_training(SMALL, STEPS, FIXED)
    sync, over = r["synchronous"], r["overlapped"]
    assert over["makespan_s"] < 0.8 * sync["makespan_s"]
    assert r["ratios"]["speedup"] == pytest.approx(sync["makespan_s"] / over["makespan_s"], rel=1e-3)
    assert over["learner_idle_share"] < sync["learner_idle_share"]
    assert over["gpu_busy_share"] > sync["gpu_busy_share"]
    assert over["staleness"]["max"] == 1 and over["stale_dropped"] == 0
    _accounted(sync, STEPS)
    _accounted(over, STEPS)
    # Deterministic: the same config gives the same figures.
    again = compare_training(SMALL, STEPS, FIXED)
    strip = lambda x: {k: v for k, v in x.items() if k != "wall_s"}  # noqa: E731
    assert strip(again["overlapped"]) == strip(over) and strip(again["synchronous"]) == strip(sync)


def test_a_push_pauses_decoding_and_later_tokens_carry_the_new_version():
    cfg = SimConfig(gpus=1, decode_base_s=0.01, decode_per_seq_s=0.0, prefill_s_per_token=0.0)

    async def main():
        service = ModelledInference(cfg)
        loop = asyncio.get_running_loop()
        t0 = loop.time()

        async def gen(episode: str, delay: float) -> tuple[int, float]:
            await asyncio.sleep(delay)
            version = await service.generate(episode, 100, 100, 1000)     # 10 s of decoding
            return version, loop.time() - t0

        async def push() -> None:
            await asyncio.sleep(5)
            service.push(3.0, 1)

        (before, t_before), (during, t_during), _ = await asyncio.gather(gen("a", 0), gen("b", 6), push())
        return before, t_before, during, t_during, service.report(loop.time())

    before, t_before, during, t_during, report = run_virtual(main())
    assert before == 0 and t_before == pytest.approx(13.0)     # 10 s of decoding + the 3 s push
    assert during == 1 and t_during == pytest.approx(18.0)     # waited for the push to end at 8 s
    assert report["gpu_paused_share"] == pytest.approx(3.0 / 18.0, rel=1e-3)


def test_the_real_run_preset_is_derived_from_the_real_run_and_matches_its_synchronous_pace():
    real = json.loads(bench.CHECKOUT_REAL.read_text())
    p = bench.real_run_preset(bench.CHECKOUT_REAL)
    rows = real["synchronous"]["rows"]
    assert p["learner"].episodes_per_step == rows[0]["episodes"]
    assert p["learner"].update_s_by_step == pytest.approx([r["time_update_s"] - r["time_push_s"] for r in rows])
    assert p["sim"].decode_base_s == pytest.approx(sum(r["time_generation_s"] for r in rows)
                                                   / sum(r["completion_tokens"] for r in rows))
    res = bench.run_sim(("real-run", "real-run-overlapped-timings"))
    ratios = res["presets"]["real-run"]["sim_over_real_synchronous"]
    assert ratios["step_interval_mean"] == pytest.approx(1.0, abs=0.1)
    assert ratios["rollout_wall_mean"] == pytest.approx(1.0, abs=0.15)
    assert bench.sim_markdown(res).count("\n") == 5 and bench.real_vs_sim_markdown(res).count("\n") == 7
    json.dumps(res)
    # The committed results were made by the same code: the real-run presets give the same figures.
    committed = json.loads((bench.CHECKOUT_REAL.parent / "results-overlap-sim.json").read_text())
    strip = lambda e: {**e, "runs": [{k: v for k, v in r.items() if k != "wall_s"} for r in e["runs"]]}  # noqa: E731
    for name in ("real-run", "real-run-overlapped-timings"):
        assert strip(res["presets"][name]) == strip(committed["presets"][name])


def test_the_gpu_preset_runs_small_with_a_learner_bound_step_that_overlap_hides():
    p = bench.gpu_preset(gpus=2)
    assert p["learner"].episodes_per_step == 32 and p["sim"].sandbox_slots == 32
    learner = p["learner"].model_copy(update={"steps": 3})
    sync = simulate_training(p["sim"], learner, p["admission"])
    over = simulate_training(p["sim"], learner.model_copy(update={"overlap": True}), p["admission"])
    assert over["makespan_s"] < sync["makespan_s"]
    assert over["staleness"]["max"] <= 1 and over["episodes_consumed"] == sync["episodes_consumed"] == 96


def test_the_script_wraps_the_module(tmp_path):
    out = tmp_path / "sim.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--preset", "real-run", "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("| preset | mode |") and "| real run, synchronous |" in proc.stdout
    res = json.loads(out.read_text())
    assert res["benchmark"] == "overlap-sim" and list(res["presets"]) == ["real-run"]
    missing = subprocess.run([sys.executable, str(SCRIPT), "--preset", "real-run", "--from-real",
                              str(tmp_path / "none.json")], capture_output=True, text=True, timeout=120)
    assert missing.returncode != 0 and "none.json" in missing.stderr
