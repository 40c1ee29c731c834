"""Does the default run learn? The default `tryloop train`, and its negative control, side by side.

    python benchmarks/learning.py [--root /var/lib/tryloop/learning] [--steps 16] [--out FILE]

1. Builds the default suite into a fresh store under --root (the synthesized function tasks and
   HumanEval, gated) and runs the reward gate: reported separately, not training time.
2. Runs `tryloop train`'s default configuration (run "learn"): it measures the learning zone of the
   untrained model first (k samples per task at T=1, stored; independent of every evaluation below),
   evaluates the held-out zone tasks and HumanEval before training, trains, and evaluates again.
3. Runs the negative control (run "control"): the same configuration and seed with the rewards
   shuffled within each group, so its updates carry no information about which answer was right.
   Its "before" is the learn run's: the same weights, tasks and episode seeds.
4. For each run: the slope of the train reward over steps with its 95% CI; held-out pass@1 before
   and after with a paired exact sign test over tasks; HumanEval pass@1 before and after (greedy)
   with the same test. Writes results-learning.json beside this file (or --out).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

from tryloop.config import TryloopConfig
from tryloop.telemetry.stats import paired_sign_test, slope_ci

HERE = Path(__file__).resolve().parent


def config(root: Path, steps: int | None) -> TryloopConfig:
    cfg = TryloopConfig()
    train = cfg.train if steps is None else cfg.train.model_copy(update={"steps": steps})
    return cfg.model_copy(update={
        "runtime": cfg.runtime.model_copy(update={"store_dir": root / "rt", "state_dir": root / "state"}),
        "tasks": cfg.tasks.model_copy(update={"store_url": str(root / "tasks"), "work_dir": root / "work"}),
        "rewards": cfg.rewards.model_copy(update={"gate_dir": root / "gate"}),
        "store": cfg.store.model_copy(update={"trajectories_url": str(root / "trajectories"),
                                              "runs_dir": root / "runs"}),
        "train": train})


def evals_by(rows: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [r for r in rows if r.get("name", "held-out") == name]


def compare(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    test = paired_sign_test(before["tasks"], after["tasks"])
    return {"before": {k: before[k] for k in ("pass_at_1", "lo", "hi", "episodes")},
            "after": {k: after[k] for k in ("pass_at_1", "lo", "hi", "episodes")},
            "tasks": len(set(before["tasks"]) & set(after["tasks"])),
            "wins": test.wins, "losses": test.losses, "ties": test.ties, "p_value": test.p_value}


def summarize(run_dir: Path, baseline: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    from tryloop.train.run import read_jsonl

    metrics = read_jsonl(run_dir / "metrics.jsonl")
    evals = baseline + [e for e in read_jsonl(run_dir / "evals.jsonl") if e["step"] >= 0]
    slope = slope_ci([m["step"] for m in metrics], [m["reward_mean"] for m in metrics])
    out: dict[str, Any] = {
        "steps": len(metrics), "wall_s": wall_s,
        "train_s": sum(m.get("time_step_s", 0.0) for m in metrics),
        "reward_slope": {"value": slope.value, "lo": slope.lo, "hi": slope.hi},
        "curve": [{k: m.get(k) for k in ("step", "reward_mean", "reward_lo", "reward_hi", "pass_rate", "groups",
                                         "groups_mixed", "refills", "episodes", "time_step_s",
                                         "time_rollout_wall_s", "time_update_s", "peak_rss_mb")}
                  for m in metrics]}
    for name in ("held-out", "humaneval"):
        rows = evals_by(evals, name)
        if len(rows) >= 2 and rows[0]["step"] == -1:
            out[name] = compare(rows[0], rows[-1])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=Path("/var/lib/tryloop/learning"))
    ap.add_argument("--steps", type=int, default=None, help="train.steps (default: tryloop train's)")
    ap.add_argument("--out", type=Path, default=HERE / "results-learning.json")
    ap.add_argument("--skip-control", action="store_true", help="only the learn run")
    args = ap.parse_args()

    import tryloop.cli.main  # noqa: F401  (registers the commands; importing cli.train first would cycle)
    from tryloop.cli.train import ensure_gate, ensure_suite
    from tryloop.train.run import read_jsonl, train

    cfg = config(args.root, args.steps)
    t0 = time.perf_counter()
    ensure_suite(cfg)
    ensure_gate(cfg)
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "suite_and_gate_s": time.perf_counter() - t0,
                              "config": cfg.train.model_dump(mode="json")}

    def log(event: str, data: dict) -> None:
        if event in ("step", "eval", "zone_done", "log"):
            print(event, json.dumps({k: v for k, v in data.items() if k not in ("tasks", "rows", "trajectory")},
                                    default=str)[:400], flush=True)

    t1 = time.perf_counter()
    learn = asyncio.run(train(cfg, cfg.train.model_copy(update={"run_id": "learn"}), resume=True, hook=log))
    zone = json.loads((learn.run_dir / "zone.json").read_text())
    baseline = [e for e in read_jsonl(learn.run_dir / "evals.jsonl") if e["step"] == -1]
    result["zone"] = {k: zone[k] for k in ("key", "band", "k", "seconds", "train", "eval", "rows")}
    result["learn"] = summarize(learn.run_dir, baseline, time.perf_counter() - t1)
    print(json.dumps(result["learn"], indent=1, default=str)[:3000], flush=True)
    args.out.write_text(json.dumps(result, indent=1, default=str))

    if not args.skip_control:
        t2 = time.perf_counter()
        algo = cfg.train.algo.model_copy(update={"shuffle_rewards": True})
        control = asyncio.run(train(cfg, cfg.train.model_copy(update={"run_id": "control", "algo": algo,
                                                                          "eval_at_start": False}),
                                    resume=True, hook=log))
        result["control"] = summarize(control.run_dir, baseline, time.perf_counter() - t2)
        print(json.dumps(result["control"], indent=1, default=str)[:3000], flush=True)
    result["total_s"] = time.perf_counter() - t0
    args.out.write_text(json.dumps(result, indent=1, default=str))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
