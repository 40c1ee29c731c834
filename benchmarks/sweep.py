"""Which hyperparameters fit the default run? Short training runs side by side on one suite.

    python benchmarks/sweep.py [--root /var/lib/tryloop/learning] [--steps 4] [--points a,b] [--seed N]
                               [--out FILE]

Runs after `benchmarks/learning.py` on the same --root: it reuses that suite, its learning-zone
measurement (the same weights, temperature and k give the same key, so nothing is measured again) and
the learn run's "before" evaluation of the held-out zone tasks (the same weights, tasks and episode
seeds). Each point is the default `tryloop train` configuration with one thing changed, trained for
--steps steps, then evaluated on the held-out zone tasks. For each point: the train reward's slope
with its 95% CI, the share of mixed groups, held-out pass@1 before and after with an exact paired
sign test over tasks, and the wall time of its steps. Run at the learn run's length, a point also
meets the default configuration head to head: its "after" against the learn run's, the same paired
test over the same tasks (`against_learn_run`), and against the current default's run of that
length (`against_default`: groups-6x4, which became the default after its run). A point that
finished is kept in the output and not run again (delete its run directory,
runs/sweep-NAME-STEPS-steps, to rerun it); `against_default` and `seeds_pooled` are computed anew
by every run of the command, so a run with nothing left to train brings them up to date.

`--seed N` (default 0, the learn run's) runs the points again with another run seed: other tasks
drawn, other episode seeds, other shuffles, under the keys NAME-seed-N (runs/sweep-NAME-STEPS-steps-seed-N).
One training run per configuration says nothing about how much its result varies between seeds;
the negative control needs this most, as its expected gain is nil. A point run with two seeds or
more also gets `seeds_pooled`: its runs' "after" evaluations pooled task by task (passes and
attempts summed) with the same paired test against the "before", a negative control's pooled
"after" against the default's seed-0 run (`CONTROLS`), and, where the default ran with the same
seeds, the pooled "after" against the default's pooled over those seeds (`against_default`).

The points vary what this scale asks to choose by measurement: the learning rate of full
fine-tuning and of LoRA, the split of a step's episodes into groups, the advantage's std floor
(0 = plain GRPO, where a group with one compiling answer and nothing passing gets +-1.7 advantages
from a 0.1 shaping term), and the sampling temperature of training. Every point keeps the learn
run's zone and evaluation: `train.zone_temperature` and `train.eval_temperature` are pinned to the
learn run's, so a temperature point trains at its own temperature on the same tasks and is judged
by the same evaluation as the others (a zone measured anew at each temperature would change the
held-out tasks, and so what "before" and "after" mean).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

# name -> (what changes, updates to train.algo, updates to train)
POINTS: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "default": ("lr 1e-5, full fine-tuning, 6 groups of 4, std floor 0.3", {}, {}),
    "lr-3e-5": ("lr 3e-5", {"lr": 3e-5}, {}),
    "lr-3e-6": ("lr 3e-6", {"lr": 3e-6}, {}),
    "std-floor-0": ("plain GRPO: advantages divided by the group's std, no floor", {"adv_std_floor": 0.0}, {}),
    "lora-1e-4": ("LoRA r=16 on the attention projections, lr 1e-4", {"lora": True, "lr": 1e-4}, {}),
    # the negative control of the default: the same updates without the reward's information
    "shuffled-rewards": ("the default with rewards shuffled within each group", {"shuffle_rewards": True}, {}),
    # the default until this sweep chose six groups of four
    "groups-4x6": ("4 groups of 6 a step (same 24 episodes)", {}, {"tasks_per_step": 4, "group_size": 6}),
    # the point that became the default (now the same as `default`), under the name its results carry
    "groups-6x4": ("6 groups of 4 a step (same 24 episodes)", {}, {"tasks_per_step": 6, "group_size": 4}),
    # training samples (and the update scores) at another temperature; the zone and evaluations stay at T=0.7
    "temperature-1.0": ("sampling temperature 1.0 in training", {"temperature": 1.0}, {"policy": {"temperature": 1.0}}),
    "temperature-0.4": ("sampling temperature 0.4 in training", {"temperature": 0.4}, {"policy": {"temperature": 0.4}}),
}


#: the default configuration's point: the first of these whose run exists at this length (groups-6x4
#: became the default after its run, so its run is the default's)
DEFAULT_POINTS = ("default", "groups-6x4")

#: the negative controls: each is the default with the reward's information taken out
CONTROLS = {"shuffled-rewards"}


def run_id(point: str, steps: int, seed: int = 0) -> str:
    """A point's run: its id names its length and seed, so a run of another is another run, not
    one to resume."""
    return f"sweep-{point}-{steps}-steps" + (f"-seed-{seed}" if seed else "")


def pooled(evals: list[dict[str, Any]]) -> dict[str, Any]:
    """Several runs' evaluations as one: each task's passes and attempts summed over the runs."""
    shared = set.intersection(*(set(e["tasks"]) for e in evals))
    return {"tasks": {t: [sum(e["tasks"][t][0] for e in evals), sum(e["tasks"][t][1] for e in evals)]
                      for t in sorted(shared)}}


def on_shared_tasks(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """pass@1 before and after on the tasks both evaluated (a point evaluates a subset of the learn
    run's held-out tasks), with the exact paired sign test over them."""
    from tryloop.telemetry.stats import paired_sign_test

    shared = sorted(before["tasks"].keys() & after["tasks"].keys())
    b = {t: before["tasks"][t] for t in shared}     # task -> (passes, attempts)
    a = {t: after["tasks"][t] for t in shared}
    test = paired_sign_test(b, a)

    def rate(rows: dict[str, Any]) -> float | None:
        fr = [c / n for c, n in rows.values() if n]
        return sum(fr) / len(fr) if fr else None

    return {"tasks": len(shared), "before": {"pass_at_1": rate(b)}, "after": {"pass_at_1": rate(a)},
            "wins": test.wins, "losses": test.losses, "ties": test.ties, "p_value": test.p_value}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=Path("/var/lib/tryloop/learning"))
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--eval-tasks", type=int, default=50, help="held-out zone tasks evaluated after each point "
                    "(train.eval_tasks; its 'before' is the learn run's on the same tasks)")
    ap.add_argument("--points", default=",".join(POINTS), help=f"comma-separated, of: {', '.join(POINTS)}")
    ap.add_argument("--seed", type=int, default=0, help="train.seed of the points' runs (0: the learn run's)")
    ap.add_argument("--out", type=Path, default=HERE / "results-sweep.json")
    args = ap.parse_args()
    names = [n for n in args.points.split(",") if n]
    unknown = [n for n in names if n not in POINTS]
    if unknown:
        ap.error(f"--points: unknown {', '.join(unknown)} (known: {', '.join(POINTS)})")

    import tryloop.cli.main  # noqa: F401  (registers the commands; importing cli.train first would cycle)
    from learning import config, summarize  # the learning benchmark beside this file
    from tryloop.cli.train import ensure_gate
    from tryloop.config import parse
    from tryloop.train.run import read_jsonl, train
    from tryloop.train.run_config import TrainRunConfig
    from tryloop.train.zone import zone_temperature_of

    cfg = config(args.root, None)
    ensure_gate(cfg)   # a newer checkout may judge with another reward version: gate it first
    learn_dir = cfg.store.runs_dir / "learn"
    if not (learn_dir / "evals.jsonl").exists():
        raise SystemExit(f"{learn_dir}: no learn run; run benchmarks/learning.py --root {args.root} first")
    baseline = [e for e in read_jsonl(learn_dir / "evals.jsonl") if e["step"] == -1 and e.get("name") == "held-out"]
    if not baseline:
        raise SystemExit(f"{learn_dir}/evals.jsonl: no held-out evaluation before training yet")
    learn_after = [e for e in read_jsonl(learn_dir / "evals.jsonl") if e["step"] >= 0 and e.get("name") == "held-out"]
    result: dict[str, Any] = json.loads(args.out.read_text()) if args.out.exists() else {}
    result.update({"date": time.strftime("%Y-%m-%d"), "steps": args.steps, "root": str(args.root)})
    points = result.setdefault("points", {})

    def log(event: str, data: dict) -> None:
        if event in ("step", "eval", "log"):
            print(event, json.dumps({k: v for k, v in data.items() if k not in ("tasks", "rows", "trajectory")},
                                    default=str)[:300], flush=True)

    seeded = f"-seed-{args.seed}" if args.seed else ""
    for point in names:
        what, algo_up, train_up = POINTS[point]
        name = point + seeded
        if points.get(name, {}).get("steps") == args.steps:
            continue
        up = {"run_id": run_id(point, args.steps, args.seed), "steps": args.steps, "eval_every": args.steps,
              "eval_at_start": False, "eval_tasks": args.eval_tasks, "check_source": None, "seed": args.seed,
              # the learn run's zone (measured once) and its evaluations' temperature, whatever the point samples at
              "zone_seed": cfg.train.seed, "zone_temperature": zone_temperature_of(cfg.train),
              "eval_temperature": baseline[0]["temperature"], **train_up}
        up["algo"] = {**cfg.train.algo.model_dump(), **algo_up}
        up["policy"] = {**cfg.train.policy.model_dump(), **train_up.get("policy", {})}
        # validated as a whole, so a point that breaks a rule (the update's temperature must be the
        # sampler's) is refused before it runs, naming the point and the field
        tcfg = parse(TrainRunConfig, {**cfg.train.model_dump(), **up}, f"sweep point {name}")
        print(f"== {name}: {what}", flush=True)
        t0 = time.perf_counter()
        run = asyncio.run(train(cfg, tcfg, resume=True, hook=log))
        s = summarize(run.run_dir, baseline, time.perf_counter() - t0)
        after = [e for e in read_jsonl(run.run_dir / "evals.jsonl") if e.get("name") == "held-out"]
        if after:
            s["held-out"] = on_shared_tasks(baseline[0], after[-1])
            # at the learn run's length, the point also meets the default configuration head to head:
            # the same "before", tasks and episode seeds, so a paired test over tasks compares the two
            if learn_after and learn_after[-1]["step"] == after[-1]["step"]:
                s["against_learn_run"] = on_shared_tasks(learn_after[-1], after[-1])
        curve = s["curve"]
        s["groups_mixed"] = sum(m["groups_mixed"] or 0 for m in curve) / max(1, sum(m["groups"] or 0 for m in curve))
        points[name] = {"what": what, "seed": args.seed, **s}
        args.out.write_text(json.dumps(result, indent=1, default=str))
        ho = s.get("held-out") or {}
        print(f"{name}: slope {s['reward_slope']['value']:+.3f} held-out {ho.get('before', {}).get('pass_at_1')} -> "
              f"{ho.get('after', {}).get('pass_at_1')} p={ho.get('p_value')}", flush=True)
        if "against_learn_run" in s:
            vs = s["against_learn_run"]
            print(f"{name} against the learn run after {args.steps} steps: {vs['before']['pass_at_1']} -> "
                  f"{vs['after']['pass_at_1']} ({vs['wins']}/{vs['losses']}/{vs['ties']}) p={vs['p_value']}", flush=True)
    # Points run with several seeds: their "after" evaluations pooled task by task, against the
    # "before" and, for a negative control, against the point it controls (its seed-0 run).
    runs_dir = cfg.store.runs_dir

    def after_of(run: str) -> dict[str, Any] | None:
        path = runs_dir / run / "evals.jsonl"
        rows = [e for e in read_jsonl(path) if e.get("name") == "held-out" and e["step"] == args.steps - 1] \
            if path.exists() else []
        return rows[-1] if rows else None

    base = next((b for b in DEFAULT_POINTS if after_of(run_id(b, args.steps)) is not None), None)
    base_after = after_of(run_id(base, args.steps)) if base is not None else None
    by_seed: dict[str, dict[int, dict[str, Any]]] = {}    # point -> seed -> its run's "after"
    for point in POINTS:
        seeds = sorted({v.get("seed", 0) for k, v in points.items() if (k == point or k.startswith(f"{point}-seed-"))
                        and v.get("steps") == args.steps})
        evals = [(seed, after_of(run_id(point, args.steps, seed))) for seed in seeds]
        evals = [(seed, e) for seed, e in evals if e is not None]
        if len(evals) < 2:
            continue
        by_seed[point] = dict(evals)
        together = pooled([e for _, e in evals])
        entry: dict[str, Any] = {"seeds": [seed for seed, _ in evals],
                                 "held-out": on_shared_tasks(baseline[0], together)}
        if point in CONTROLS and base_after is not None:
            entry["against_" + base] = on_shared_tasks(together, base_after)
        result.setdefault("seeds_pooled", {})[point] = entry
        ho = entry["held-out"]
        print(f"{point}, seeds {entry['seeds']} pooled: held-out {ho['before']['pass_at_1']:.3f} -> "
              f"{ho['after']['pass_at_1']:.3f} ({ho['wins']}/{ho['losses']}/{ho['ties']}) p={ho['p_value']:.3g}",
              flush=True)
    # A point run with several seeds against the default run with the same seeds, both pooled
    for point, runs in by_seed.items():
        shared = sorted(runs.keys() & by_seed.get(base, {}).keys()) if point != base else []
        if len(shared) >= 2:
            vs = result["seeds_pooled"][point]["against_default"] = {
                "default": base, "seeds": shared,
                **on_shared_tasks(pooled([by_seed[base][s] for s in shared]), pooled([runs[s] for s in shared]))}
            print(f"{point} against {base}, seeds {shared} pooled: {vs['before']['pass_at_1']:.3f} -> "
                  f"{vs['after']['pass_at_1']:.3f} ({vs['wins']}/{vs['losses']}/{vs['ties']}) p={vs['p_value']:.3g}",
                  flush=True)
    # Every other point's run against the default's (seed 0) at this length: the same paired test
    # over the same tasks, on the two runs' "after" evaluations (`against_learn_run` meets the learn
    # run, which is the default of its time, not the current one).
    for name, entry in points.items() if base is not None else ():
        point, seed = name.split("-seed-")[0], entry.get("seed", 0)
        after = after_of(run_id(point, args.steps, seed)) if entry.get("steps") == args.steps else None
        if after is None or (point in DEFAULT_POINTS and not seed):
            continue
        vs = entry["against_default"] = {"default": base, **on_shared_tasks(base_after, after)}
        print(f"{name} against {base}: {vs['before']['pass_at_1']:.3f} -> {vs['after']['pass_at_1']:.3f} "
              f"({vs['wins']}/{vs['losses']}/{vs['ties']}) p={vs['p_value']:.3g}", flush=True)
    args.out.write_text(json.dumps(result, indent=1, default=str))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
