"""Does the default run learn? Held-out and HumanEval pass@1 before and after, with intervals.

    python benchmarks/learning.py [--steps 10] [--root /var/lib/tryloop/learning]

1. Builds the HumanEval tasks into a fresh store (gated, split by family) and runs
   the reward gate.
2. Evaluates the untrained SmolLM2-135M greedily on every HumanEval task (the
   held-out split is reported separately from the train split).
3. Runs `tryloop train`'s default configuration for a fixed number of steps.
4. Evaluates the trained weights the same way.
Writes results-learning.json beside this file: pass@1 with 95% Wilson intervals
per split, before and after, and the training curve. Greedy decoding makes each
evaluation deterministic, so the difference is the policy's, not sampling noise;
the interval says how far that difference generalises over tasks.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

from tryloop.config import TryloopConfig
from tryloop.rewards.gold import GateRecords, builtin_items, pick_representatives, run_gate
from tryloop.sandbox import SandboxRuntime
from tryloop.tasks.factory import build_humaneval
from tryloop.tasks.gate import GateConfig
from tryloop.tasks.store import TaskStore
from tryloop.telemetry.stats import wilson_interval


async def evaluate_all(cfg: TryloopConfig, weights, label: str, train_subset: int | None = None) -> dict:
    from tryloop.agent.environments import Environments
    from tryloop.agent.hf import load_model
    from tryloop.agent.hf_policy import HFPolicy
    from tryloop.eval.config import EvalConfig
    from tryloop.eval.run import evaluate
    from tryloop.eval.scheduled import ScheduledRunner, bounded

    store = TaskStore(cfg.tasks.store_url)
    tasks = [store.get(e.fingerprint) for e in store.query(source="humaneval")]
    if train_subset is not None:  # every held-out task, and the first N train tasks by fingerprint
        train = sorted((t for t in tasks if t.meta.split == "train"), key=lambda t: t.fingerprint())
        tasks = [t for t in tasks if t.meta.split == "eval"] + train[:train_subset]
    split = {t.fingerprint(): t.meta.split for t in tasks}
    tc = cfg.train
    policy = HFPolicy(load_model(tc.policy.name), temperature=0.0, max_new_tokens=tc.limits.max_new_tokens,
                      max_context=tc.limits.max_context_tokens, max_batch=16)
    if weights is not None:
        await policy.engine.update_weights(weights, version=label)
    envs = Environments(SandboxRuntime(cfg.runtime))
    t0 = time.perf_counter()
    runner = ScheduledRunner(bounded(cfg.scheduler, 16))
    try:
        res = await evaluate(tasks, policy, envs, cfg=EvalConfig(k=1, concurrency=16, limits=tc.limits),
                             run_id=f"learning-{label}", runner=runner,
                             spec=cfg.rewards.spec, out_dir=Path(cfg.store.runs_dir) / f"learning-{label}")
    finally:
        await runner.aclose()
        await envs.close()
        policy.close()
    out = {"wall_s": round(time.perf_counter() - t0, 1)}
    for name in ("train", "eval", "all"):
        ts = [t for t in res.trajectories if name == "all" or split[t.task_fingerprint] == name]
        n, c = len(ts), sum(t.verdict == "pass" for t in ts)
        lo, hi = wilson_interval(c, n) if n else (0.0, 0.0)
        out[name] = {"tasks": n, "passed": c, "pass_at_1": c / n if n else None, "ci95": [lo, hi],
                     "passed_ids": sorted(t.task_id for t in ts if t.verdict == "pass"),
                     "task_ids": sorted(t.task_id for t in ts)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--root", type=Path, default=Path("/var/lib/tryloop/learning"))
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("results-learning.json"))
    ap.add_argument("--reuse-before", action="store_true", help="keep the 'before' evaluation already in --out")
    ap.add_argument("--eval-only", action="store_true",
                    help="no more training: evaluate the run's latest checkpoint (a run stopped early)")
    ap.add_argument("--after-train-subset", type=int, default=None,
                    help="evaluate after training on every held-out task but only N train tasks "
                         "(compared with 'before' on the same tasks)")
    args = ap.parse_args()
    r = args.root
    cfg = TryloopConfig.model_validate({
        "runtime": {"store_dir": str(r / "rt"), "state_dir": str(r / "state")},
        "tasks": {"store_url": str(r / "tasks"), "work_dir": str(r / "work")},
        "rewards": {"gate_dir": str(r / "gate"), "gold_path": str(r / "gold.jsonl")},
        "store": {"trajectories_url": str(r / "traj"), "runs_dir": str(r / "runs")},
        "train": {"steps": args.steps, "eval_tasks": 0, "eval_at_start": False, "run_id": "learning"},
    })
    rt = SandboxRuntime(cfg.runtime)
    store = TaskStore(cfg.tasks.store_url)
    if not store.query(source="humaneval"):
        rep = asyncio.run(build_humaneval(rt, store, r / "work", gate=GateConfig(k=1), eval_fraction=0.25))
        print(f"tasks: {rep.total_kept} kept, {rep.total_rejected} rejected", flush=True)
    tasks = {e.fingerprint: store.get(e.fingerprint) for e in store.entries()}
    reps = pick_representatives(tasks.values())[:3]
    gold = [i for t in reps for i in builtin_items(t)]
    if not args.eval_only:
        gate = asyncio.run(run_gate(rt, tasks, gold, cfg.rewards.spec, GateRecords(cfg.rewards.gate_dir)))
        print(f"gate approved: {gate.approved}", flush=True)
    results = {"config": cfg.train.model_dump(mode="json")}
    if args.reuse_before:
        results["before"] = json.loads(args.out.read_text())["before"]
    else:
        results["before"] = asyncio.run(evaluate_all(cfg, None, "before"))
    print("before", {k: v for k, v in results["before"].items() if k != "wall_s"}, flush=True)
    args.out.write_text(json.dumps(results, indent=1))

    from tryloop.train import checkpoint
    from tryloop.train.run import train

    t0 = time.perf_counter()
    run_dir = Path(cfg.store.runs_dir) / "learning"
    if args.eval_only:
        from tryloop.train.report import write_report
        from tryloop.train.run import read_jsonl

        metrics = read_jsonl(run_dir / "metrics.jsonl")
        report = write_report(run_dir, metrics, read_jsonl(run_dir / "evals.jsonl"),
                              json.loads((run_dir / "manifest.json").read_text()))
        results["train"] = {"wall_s": None, "metrics": metrics, "stopped_after_step": metrics[-1]["step"],
                            "report": str(report)}
    else:
        res = asyncio.run(train(cfg, cfg.train, resume=checkpoint.latest(run_dir) is not None,
                                hook=lambda e, d: print(e, {k: v for k, v in d.items() if k in (
                                    "step", "reward_mean", "pass_rate", "learn_loss", "groups_dropped")},
                                    flush=True) if e == "step" else None))
        results["train"] = {"wall_s": round(time.perf_counter() - t0, 1), "metrics": res.metrics,
                            "report": str(res.report_path)}
    learner_state, _ = checkpoint.load(checkpoint.latest(run_dir))
    results["after"] = asyncio.run(evaluate_all(cfg, learner_state["model"], "after", args.after_train_subset))
    print("after", {k: v for k, v in results["after"].items() if k != "wall_s"}, flush=True)
    results["paired"] = paired(results["before"], results["after"])
    print("paired", results["paired"], flush=True)
    args.out.write_text(json.dumps(results, indent=1))


def paired(before: dict, after: dict) -> dict:
    """Before vs after on the same tasks: counts, and the tasks that flipped each way (a sign test
    over discordant tasks says whether the change is outside noise)."""
    from math import comb

    out = {}
    for name in ("train", "eval", "all"):
        ids = set(after[name]["task_ids"])
        b, a = set(before[name]["passed_ids"]) & ids, set(after[name]["passed_ids"])
        gained, lost = sorted(a - b), sorted(b - a)
        n = len(gained) + len(lost)
        # two-sided exact sign test p-value
        p = min(1.0, 2 * sum(comb(n, k) for k in range(0, min(len(gained), len(lost)) + 1)) / 2 ** n) if n else 1.0
        out[name] = {"tasks": len(ids), "before": len(b), "after": len(a), "gained": gained, "lost": lost,
                     "sign_test_p": p}
    return out


if __name__ == "__main__":
    main()
