#!/usr/bin/env python3
"""The simulator's figures behind docs/scaling.md: 64 and 512 GPUs, sandbox slots per GPU swept.

    .venv/bin/python benchmarks/scaling_sim.py                  # prints the table
    .venv/bin/python benchmarks/scaling_sim.py --out benchmarks/results-scaling-sim.json
    .venv/bin/python benchmarks/scaling_sim.py --gpus 8 --episodes-per-gpu 20   # a smoke run

Each row is one `tryloop.scheduler.sim.simulate` run: the real scheduler with adaptive
admission on virtual time, modelled GPUs (continuous batching, prefix cache, KV eviction)
and modelled sandbox slots. The workload is SimConfig's default agent episode (4-12 turns,
2,000 prompt tokens, 400 generated and 600 tool-output tokens per turn, 2 s CPU per tool
call, 15 s verification). Runs are deterministic: the same arguments give the same figures.
What these runs do not model: the learner (no weight updates, no pauses for them; that is
`simulate_training`, in benchmarks/overlap_sim.py), network between nodes, and failures.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from tryloop.scheduler import AdmissionConfig  # noqa: E402
from tryloop.scheduler.sim import SimConfig, simulate  # noqa: E402

GPUS = (64, 512)
SLOTS_PER_GPU = (8, 16, 32)
EPISODES_PER_GPU = 100
INITIAL_PER_GPU = 8      # admission starts at 8 episodes per GPU, so slow start takes as long at any scale


def run(gpus: tuple[int, ...] = GPUS, slots_per_gpu: tuple[int, ...] = SLOTS_PER_GPU,
        episodes_per_gpu: int = EPISODES_PER_GPU, seed: int = 0,
        initial: int | None = None) -> dict[str, Any]:
    """`initial`: admission's starting limit in all; None: INITIAL_PER_GPU per GPU."""
    rows = []
    for n in gpus:
        for per in slots_per_gpu:
            cfg = SimConfig(gpus=n, sandbox_slots=n * per, episodes=n * episodes_per_gpu, seed=seed)
            adm = AdmissionConfig(adaptive=True, initial=initial or n * INITIAL_PER_GPU, max=n * 256)
            r = simulate(cfg, adm)
            steady = r["until_90pct_done"]
            rows.append({
                "gpus": n,
                "sandbox_slots": cfg.sandbox_slots,
                "slots_per_gpu": per,
                "episodes": cfg.episodes,
                "episodes_per_hour": r["episodes_per_hour"],
                "episodes_per_gpu_hour": round(r["episodes_per_hour"] / n, 1),
                "makespan_s": r["makespan_s"],
                "gpu_busy_share": round(1 - r["gpu_idle_share"], 4),
                "gpu_unproductive_share": r["gpu_unproductive_share"],
                "steady_gpu_unproductive_share": steady.get("gpu_unproductive_share"),
                "steady_sandbox_idle_share": steady.get("sandbox_idle_share"),
                "decode_share_of_peak": r["decode_share_of_peak"],
                "peak_concurrent_episodes": r["peak_concurrent_episodes"],
                "admission_limit_final": r["admission_limit"]["final"],
                "inference_latency_mean_s": r["inference_latency_mean_s"],
                "episode_running_s_p50": r["episode_running_s_p50"],
                "wall_s": r["wall_s"],
                "raw": r,
            })
    return {
        "benchmark": "scaling-sim",
        "format": 1,
        "workload": SimConfig().model_dump(exclude={"gpus", "sandbox_slots", "episodes", "seed"}),
        "episodes_per_gpu": episodes_per_gpu,
        "seed": seed,
        "admission": (f"adaptive, initial {initial} in all" if initial else f"adaptive, initial {INITIAL_PER_GPU} per GPU")
        + ", max 256 per GPU",
        "rows": rows,
    }


def table(results: dict[str, Any]) -> str:
    head = ("| GPUs | sandbox slots (per GPU) | episodes | episodes/h | per GPU·h | GPU busy | "
            "decode share of peak | GPU unproductive (steady) | sandbox idle (steady) | peak concurrent episodes |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in results["rows"]:
        lines.append(
            f"| {r['gpus']} | {r['sandbox_slots']:,} ({r['slots_per_gpu']}) | {r['episodes']:,} | "
            f"{r['episodes_per_hour']:,.0f} | {r['episodes_per_gpu_hour']:,.0f} | "
            f"{r['gpu_busy_share']:.1%} | {r['decode_share_of_peak']:.1%} | {r['gpu_unproductive_share']:.1%} "
            f"({(r['steady_gpu_unproductive_share'] or 0):.1%}) | "
            f"{(r['steady_sandbox_idle_share'] or 0):.1%} | {r['peak_concurrent_episodes']:,} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, nargs="+", default=list(GPUS))
    parser.add_argument("--slots-per-gpu", type=int, nargs="+", default=list(SLOTS_PER_GPU))
    parser.add_argument("--episodes-per-gpu", type=int, default=EPISODES_PER_GPU)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--initial", type=int, help=f"admission's starting limit in all (default {INITIAL_PER_GPU} per GPU)")
    parser.add_argument("--out", type=Path, help="write the results here as JSON")
    args = parser.parse_args()
    results = run(tuple(args.gpus), tuple(args.slots_per_gpu), args.episodes_per_gpu, args.seed, args.initial)
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(table(results))


if __name__ == "__main__":
    main()
