"""Synchronous against overlapped training steps, side by side, on a local multi-node Ray cluster.

    python benchmarks/overlap.py [--steps 5] [--nodes 2] [--tasks-per-step 2] [--group-size 2]
                                 [--max-new-tokens 64] [--out FILE]

Builds a small store (HumanEval tasks, gated, with an approved reward gate) in a temporary
directory, starts a local Ray cluster (Ray's `cluster_utils.Cluster`: a head and `--nodes` sandbox
nodes), and runs `tryloop train` on the Ray engine twice with the same settings and seed: once
synchronous (`train.overlap: false`), once overlapped (`train.overlap: true`, `max_staleness: 1`).
The bundled 135M model is served by the learner's process; every step takes a real optimizer step.
The runs go one after the other (not at once: they would share the cores).

Per run it reports the interval between consecutive step ends (the loop's throughput; the first
step, which has nothing to overlap with, is left out), the learner's wait for episodes
(`time_rollout_wait_s` for the overlapped run; the rollout's wall time for the synchronous one),
the update time, and staleness. Writes results-overlap.json beside this file (or --out).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
SPEC = {"components": [{"name": "correctness", "kind": "tests", "weight": 1.0},
                       {"name": "compiles", "kind": "compiles", "weight": 0.1},
                       {"name": "brevity", "kind": "tokens", "weight": 0.1, "budget": 160}]}


def config(root: Path, args: argparse.Namespace, **train) -> Path:
    doc = {
        "runtime": {"store_dir": str(root / "rt"), "state_dir": str(root / "state"), "cgroup_name": "tryloop-bench"},
        "tasks": {"store_url": str(root / "tasks"), "work_dir": str(root / "work"), "eval_fraction": 0.3},
        "rewards": {"spec": SPEC, "gate_dir": str(root / "gate"), "gold_path": str(root / "gold.jsonl")},
        "store": {"trajectories_url": str(root / "traj"), "runs_dir": str(root / "runs")},
        "scheduler": {"engine": "ray", "ray": {"host_resource": "sandbox_host", "episodes_per_host": 4},
                      "admission": {"adaptive": False, "initial": 8, "max": 8}},
        "train": {"steps": args.steps, "tasks_per_step": args.tasks_per_step, "group_size": args.group_size,
                  "concurrency": 8, "eval_tasks": 0, "source": "humaneval", "zone": False, "check_source": None,
                  "refill_groups": 0, "eval_at_start": False, "policy": {"temperature": 1.0, "max_batch": 8},
                  "algo": {"lr": 1e-5, "micro_batch": 2, "old_logprobs": "recompute"},
                  "sampler": {"weights_dir": str(root / "weights")},
                  "limits": {"max_turns": 1, "max_new_tokens": args.max_new_tokens,
                             "max_total_tokens": args.max_new_tokens, "max_context_tokens": 1024}, **train},
    }
    path = root / f"{train['run_id']}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def prepare(root: Path) -> None:
    from tryloop.config import load_yaml
    from tryloop.rewards.gold import GateRecords, builtin_items, run_gate
    from tryloop.sandbox import SandboxRuntime
    from tryloop.tasks.factory import build_humaneval
    from tryloop.tasks.gate import GateConfig
    from tryloop.tasks.store import TaskStore

    cfg = load_yaml(config(root, argparse.Namespace(steps=1, tasks_per_step=1, group_size=2, max_new_tokens=64),
                           run_id="prepare"))
    rt = SandboxRuntime(cfg.runtime)
    store = TaskStore(cfg.tasks.store_url)
    asyncio.run(build_humaneval(rt, store, root / "work", gate=GateConfig(k=1), eval_fraction=0.3, limit=8))
    task = store.get(store.query(split="train")[0].fingerprint)
    gold = [i for i in builtin_items(task) if i.label in ("reference", "do_nothing")]
    out = asyncio.run(run_gate(rt, {task.fingerprint(): task}, gold, cfg.rewards.spec,
                               GateRecords(cfg.rewards.gate_dir)))
    if not out.approved:
        sys.exit(f"the reward gate refused the spec: {out.report()}")


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))] if xs else float("nan")


def summarise(rows: list[dict], started: float) -> dict:
    ends = [started] + [r["time"] for r in rows]
    intervals = [b - a for a, b in zip(ends, ends[1:], strict=False)][1:]   # step 0 has nothing to overlap
    waits = [r.get("time_rollout_wait_s", r["time_rollout_wall_s"]) for r in rows][1:]
    updates = [r["time_update_s"] for r in rows][1:]
    return {"steps": len(rows), "wall_s": rows[-1]["time"] - started,
            "step_interval_s": {"p50": pct(intervals, 0.5), "p90": pct(intervals, 0.9),
                                "mean": statistics.fmean(intervals)},
            "learner_wait_s": {"p50": pct(waits, 0.5), "p90": pct(waits, 0.9), "mean": statistics.fmean(waits)},
            "update_s": {"p50": pct(updates, 0.5), "mean": statistics.fmean(updates)},
            "staleness_max": max((r.get("staleness_max", 0) for r in rows), default=0),
            "stale_dropped": sum(r.get("stale_dropped", 0) for r in rows),
            "episodes": sum(r["episodes"] for r in rows), "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--tasks-per-step", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--out", type=Path, default=HERE / "results-overlap.json")
    args = ap.parse_args()

    import ray
    from ray.cluster_utils import Cluster

    import tryloop.cli.main  # noqa: F401  (the CLI's import order)
    from tryloop.config import load_yaml
    from tryloop.train.run import train

    root = Path(tempfile.mkdtemp(prefix="tryloop-overlap-"))
    t0 = time.perf_counter()
    prepare(root)
    print(f"store ready in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    for _ in range(args.nodes):
        c.add_node(num_cpus=1, resources={"sandbox_host": 1})
    ray.init(address=c.address, log_to_driver=False)
    c.wait_for_nodes()
    results: dict = {"date": time.strftime("%Y-%m-%d"), "settings": vars(args) | {"out": str(args.out)}}
    try:
        for name, extra in (("synchronous", {"overlap": False}), ("overlapped", {"overlap": True, "max_staleness": 1})):
            cfg = load_yaml(config(root, args, run_id=name, **extra))
            started = time.time()
            res = asyncio.run(train(cfg, cfg.train))
            results[name] = summarise(res.metrics, started)
            s = results[name]
            print(f"{name}: {s['wall_s']:.1f} s for {s['steps']} steps; step interval p50 "
                  f"{s['step_interval_s']['p50']:.1f} s", file=sys.stderr)
    finally:
        ray.shutdown()
        c.shutdown()
    sync, over = results["synchronous"], results["overlapped"]
    results["ratios"] = {
        "step_interval_p50": over["step_interval_s"]["p50"] / sync["step_interval_s"]["p50"],
        "step_interval_mean": over["step_interval_s"]["mean"] / sync["step_interval_s"]["mean"],
        "learner_wait_mean": over["learner_wait_s"]["mean"] / sync["learner_wait_s"]["mean"],
    }
    args.out.write_text(json.dumps(results, indent=1, default=str))
    print(json.dumps({k: v for k, v in results.items() if k in ("ratios",)}, indent=1))


if __name__ == "__main__":
    main()
