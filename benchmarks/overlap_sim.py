#!/usr/bin/env python3
"""Synchronous against overlapped training steps in the simulator, side by side (docs/train.md, docs/scaling.md).

    .venv/bin/python benchmarks/overlap_sim.py                  # prints the table
    .venv/bin/python benchmarks/overlap_sim.py --out benchmarks/results-overlap-sim.json
    .venv/bin/python benchmarks/overlap_sim.py --preset real-run   # one preset

Each run is one `tryloop.scheduler.sim.simulate_training`: the real scheduler on virtual time,
modelled GPUs and sandbox slots, and a modelled learner whose update takes a set time and whose
weight push stops every sampling GPU for `push_s` and empties its prefix cache. The synchronous
run admits step n+1's episodes after step n's push; the overlapped runs sample them while step n
updates, drop an episode more than `max_staleness` versions behind its step when it comes back
and sample it again (tryloop train's rule). Every run of a preset has the same workload and seed.

Presets:
- real-run: the timings of the real local-cluster run in results-overlap.json (its synchronous
  half), derived from that file in `real_run_preset`: decode time per token, verification,
  each step's update, the push, the time between a step's end and the next step's start, the
  episodes per step and the sandbox slots. Its synchronous step interval is compared with the
  real one. real-run-overlapped-timings: the same, fitted to the overlapped half, whose update
  and generation ran slower for sharing 2 CPUs; its overlapped run is compared with the real one.
- gpu-64: 64 sampler GPUs with the simulator's default agent episode (4-12 turns), 1,024
  episodes per step, and a learner on GPUs of its own; see `gpu_preset` for its assumptions.
  gpu-64-fast-learner: the same with an update 4x faster; gpu-64-adaptive: with the scheduler's
  adaptive admission instead of a fixed limit.

Deterministic: the same arguments give the same figures (`wall_s` aside).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from tryloop.scheduler import AdmissionConfig  # noqa: E402
from tryloop.scheduler.sim import LearnerConfig, SimConfig, simulate_training  # noqa: E402

HERE = Path(__file__).resolve().parent
REAL = HERE / "results-overlap.json"
# What benchmarks/overlap.py runs with and results-overlap.json does not record: the served
# model's batch (`train.policy.max_batch`), one CPU per sandbox node (so one execution slot),
# and fixed admission at `train.concurrency`.
REAL_MAX_BATCH = 8
REAL_SLOTS_PER_NODE = 1
REAL_CONCURRENCY = 8


def real_run_preset(path: Path = REAL, seed: int = 0, half: str = "synchronous") -> dict[str, Any]:
    """The simulator fitted to one half (`synchronous` or `overlapped`) of a `benchmarks/overlap.py` run.

    Per episode (sums over every step's episodes, divided by their number): tokens generated and
    seconds of generation give one decode step's time (the run's batch, not a batch-size law:
    `decode_per_seq_s` is 0); verification and environment seconds give the verifier's and the
    tool call's mean. The learner replays each step's update (`time_update_s` less the push it
    includes), pushes for the mean `time_push_s`, and takes the mean time between a step's
    metrics row and the next step's start (checkpoint, bookkeeping) as `checkpoint_s`. Not in
    the file, so not modelled: sandbox provisioning (0) and prefill (0; one short prompt)."""
    real = json.loads(path.read_text())
    settings, rows = real["settings"], real[half]["rows"]
    episodes = sum(r["episodes"] for r in rows)
    tokens = sum(r["completion_tokens"] for r in rows) / episodes
    gen_s = sum(r["time_generation_s"] for r in rows) / episodes
    verify_s = sum(r["time_verification_s"] for r in rows) / episodes
    env_s = sum(r["time_environment_s"] for r in rows) / episodes
    between = [b["time"] - a["time"] - b["time_step_s"] for a, b in zip(rows, rows[1:], strict=False)]
    sim = SimConfig(
        gpus=1, decode_base_s=gen_s / tokens, decode_per_seq_s=0.0, prefill_s_per_token=0.0,
        max_batch=REAL_MAX_BATCH, sandbox_slots=settings["nodes"] * REAL_SLOTS_PER_NODE,
        episodes=settings["tasks_per_step"] * settings["group_size"], turns=(1, 1), prompt_tokens=200,
        gen_tokens=tokens, gen_sigma=0.0, tool_output_tokens=0, tool_cpu_s=max(env_s, 1e-6),
        provision_s=0.0, verify_cpu_s=verify_s, seed=seed)
    learner = LearnerConfig(
        steps=settings["steps"], tasks_per_step=settings["tasks_per_step"], group_size=settings["group_size"],
        update_s_by_step=tuple(r["time_update_s"] - r["time_push_s"] for r in rows),
        push_s=statistics.fmean(r["time_push_s"] for r in rows), checkpoint_s=max(0.0, statistics.fmean(between)),
        max_staleness=1)
    adm = AdmissionConfig(adaptive=False, initial=REAL_CONCURRENCY, max=REAL_CONCURRENCY)
    measured = {m: {"step_interval_s": real[m]["step_interval_s"], "learner_wait_s": real[m]["learner_wait_s"],
                    "wall_s": real[m]["wall_s"], "update_s_mean": real[m]["update_s"]["mean"],
                    "staleness_max": real[m]["staleness_max"], "stale_dropped": real[m]["stale_dropped"],
                    "rollout_wall_s_mean": statistics.fmean(r["time_rollout_wall_s"] for r in real[m]["rows"][1:])}
                for m in ("synchronous", "overlapped")}
    return {"sim": sim, "learner": learner, "admission": adm, "variants": [(1, 1)],
            "source": {"file": path.name, "date": real.get("date"), "fitted_to": half, "measured": measured,
                       "derived": {"tokens_per_episode": round(tokens, 2), "generation_s_per_episode": round(gen_s, 3),
                                   "decode_step_s": round(gen_s / tokens, 5), "verify_s": round(verify_s, 3),
                                   "update_s_by_step": [round(x, 3) for x in learner.update_s_by_step],
                                   "push_s": round(learner.push_s, 3), "checkpoint_s": round(learner.checkpoint_s, 3)}}}


def gpu_preset(gpus: int = 64, seed: int = 0, update_s_per_token: float = 5e-5, adaptive: bool = False,
               variants: tuple[tuple[int, int], ...] = ((1, 1), (0, 1), (2, 2), (1, 2))) -> dict[str, Any]:
    """`gpus` sampler GPUs (16 sandbox slots each, the simulator's default agent episode, as in
    docs/scaling.md) and a learner on GPUs of its own. Assumed, not measured: 16 episodes per GPU
    per step (64 tasks x 16 samples at 64 GPUs); an update of 20 s plus 50 us per generated token
    (about 3.3M generated tokens a step: some 185 s, the order of a full fine-tune of an 8B model
    on one 8-GPU node); a 20 s push (16 GB of weights read from a shared filesystem) that stops
    every sampler; admission fixed at 32 episodes per GPU (where adaptive admission settled in
    docs/scaling.md), so that only the learner differs between runs."""
    sim = SimConfig(gpus=gpus, sandbox_slots=gpus * 16, episodes=gpus * 16, seed=seed)
    learner = LearnerConfig(steps=6, tasks_per_step=gpus, group_size=16, update_s=20.0,
                            update_s_per_token=update_s_per_token, push_s=20.0, max_staleness=1)
    adm = (AdmissionConfig(adaptive=True, initial=gpus * 8, max=gpus * 256) if adaptive else
           AdmissionConfig(adaptive=False, initial=gpus * 32, max=gpus * 32))
    assumed = gpu_preset.__doc__.split("Assumed, not measured: ")[1]
    return {"sim": sim, "learner": learner, "admission": adm, "variants": list(variants),
            "source": {"assumed": " ".join(assumed.split())}}


# name -> preset(seed). Variants are (max_staleness, ahead): tryloop train's pipeline (one step
# ahead) at the bound it runs with and at 0; two steps ahead with the bound at 2 and at 1.
PRESETS: dict[str, Callable[[int], dict[str, Any]]] = {
    "real-run": lambda seed: real_run_preset(REAL, seed, "synchronous"),
    "real-run-overlapped-timings": lambda seed: real_run_preset(REAL, seed, "overlapped"),
    "gpu-64": lambda seed: gpu_preset(64, seed),
    # a learner 4x faster: the rollout, not the update, sets the pace
    "gpu-64-fast-learner": lambda seed: gpu_preset(64, seed, update_s_per_token=1.25e-5, variants=((1, 1),)),
    # the scheduler's adaptive admission instead of a fixed limit
    "gpu-64-adaptive": lambda seed: gpu_preset(64, seed, adaptive=True, variants=((1, 1),)),
}


def run(presets: tuple[str, ...] = tuple(PRESETS), seed: int = 0) -> dict[str, Any]:
    out: dict[str, Any] = {"benchmark": "overlap-sim", "format": 1, "seed": seed, "presets": {}}
    for name in presets:
        p = PRESETS[name](seed)
        sim, learner, adm = p["sim"], p["learner"], p["admission"]
        sync = simulate_training(sim, learner.model_copy(update={"overlap": False}), adm)
        runs = [sync]
        for k, ahead in p["variants"]:
            r = simulate_training(sim, learner.model_copy(update={"overlap": True, "max_staleness": k, "ahead": ahead}),
                                  adm)
            r["speedup"] = round(sync["makespan_s"] / r["makespan_s"], 4)
            r["step_interval_p50_ratio"] = round(r["step_interval_s"]["p50"] / sync["step_interval_s"]["p50"], 4)
            runs.append(r)
        entry = {"sim": sim.model_dump(mode="json"), "learner": learner.model_dump(mode="json", exclude={"overlap"}),
                 "admission": adm.model_dump(mode="json", include={"adaptive", "initial", "max"}),
                 "source": p["source"], "runs": runs}
        if name.startswith("real-run"):    # the simulated run of the fitted half over the real one
            half = p["source"]["fitted_to"]
            mine, meas = runs[0] if half == "synchronous" else runs[1], p["source"]["measured"][half]
            entry[f"sim_over_real_{half}"] = {
                "step_interval_p50": round(mine["step_interval_s"]["p50"] / meas["step_interval_s"]["p50"], 4),
                "step_interval_mean": round(mine["step_interval_s"]["mean"] / meas["step_interval_s"]["mean"], 4),
                "rollout_wall_mean": round(mine["rollout_wall_s"]["mean"] / meas["rollout_wall_s_mean"], 4),
            }
        out["presets"][name] = entry
    return out


def table(results: dict[str, Any]) -> str:
    head = ("| preset | mode | max staleness (ahead) | makespan s | step interval p50 / p90 s | learner idle | "
            "GPU busy | GPU paused | staleness max (mean) | stale dropped | speedup |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for name, p in results["presets"].items():
        for r in p["runs"]:
            over = r["mode"] == "overlapped"
            bound = f"{r['max_staleness']} ({r['ahead']})" if over else "–"
            speedup = f"{r['speedup']:.2f}×" if over else "1.00×"
            lines.append(
                f"| {name} | {r['mode']} | {bound} | "
                f"{r['makespan_s']:,.1f} | {r['step_interval_s']['p50']:,.1f} / {r['step_interval_s']['p90']:,.1f} | "
                f"{r['learner_idle_share']:.1%} | {r['gpu_busy_share']:.1%} | {r['gpu_paused_share']:.1%} | "
                f"{r['staleness']['max']} ({r['staleness']['mean']:.2f}) | {r['stale_dropped']:,} | "
                f"{speedup} |")
    return "\n".join(lines)


def real_table(results: dict[str, Any]) -> str:
    """The real run's two halves, then the simulator fitted to each half running both modes."""
    real = {n: p for n, p in results["presets"].items() if n.startswith("real-run")}
    if not real:
        return ""
    head = "| | step interval p50 s | p90 s | mean s | rollout wall mean s | learner wait p50 s | wall s |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    meas = next(iter(real.values()))["source"]["measured"]
    for mode, m in meas.items():
        lines.append(f"| real run, {mode} | {m['step_interval_s']['p50']:.1f} | {m['step_interval_s']['p90']:.1f} | "
                     f"{m['step_interval_s']['mean']:.1f} | {m['rollout_wall_s_mean']:.1f} | "
                     f"{m['learner_wait_s']['p50']:.1f} | {m['wall_s']:.1f} |")
    for p in real.values():
        for r in p["runs"]:
            lines.append(f"| simulator fitted to the {p['source']['fitted_to']} half, {r['mode']} | "
                         f"{r['step_interval_s']['p50']:.1f} | {r['step_interval_s']['p90']:.1f} | "
                         f"{r['step_interval_s']['mean']:.1f} | {r['rollout_wall_s']['mean']:.1f} | "
                         f"{r['learner_wait_s']['p50']:.1f} | {r['makespan_s']:.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", nargs="+", choices=list(PRESETS), default=list(PRESETS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="write the results here as JSON")
    args = parser.parse_args()
    results = run(tuple(args.preset), args.seed)
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(table(results))
    if real := real_table(results):
        print()
        print(real)


if __name__ == "__main__":
    main()
