"""`tryloop bench episodes`: oracle episodes per second, and how much of their time is tryloop.

The oracle (tryloop.agent.scripted.Oracle) does what a perfect agent does through
the tools: view a file, write the reference solution, run the tests, submit; the
verifier then judges the diff in a fresh sandbox. An episode runs the task's
tests twice (the agent's own run and the verifier's), so its time splits into

    tests     the oracle's pytest shell call (its observation's env_s)
              + the verifier's test run (traj.times["tests_in_verify"])
    tryloop   everything else: sandbox acquire, the other tool calls, the
              workspace diff, the verifier's sandbox, detectors and bookkeeping

and `overhead share = 1 - tests / total`, summed over episodes. Measured at
concurrency 1 and 2 on the bundled multi-file tasks and a few HumanEval tasks,
with the bare baseline beside it: the same tests run once per task the plainest
way (tryloop.tasks.testrun.run_tests with the reference solution: fresh sandbox,
files written, pytest). At concurrency 1 each episode is interleaved with a bare
run of the same task (the order alternating by round), so load from neighbours
weighs on both sides alike; episodes/s there counts the episodes' own time. One
untimed warm-up episode per task first builds the snapshots, the warm pools and
the verifier's per-task baseline run.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from tryloop.agent.environments import Environments
from tryloop.agent.episode import EpisodeRequest, run_episode
from tryloop.agent.scripted import Oracle
from tryloop.agent.trajectory import Trajectory
from tryloop.bench.reward import pct
from tryloop.config import TryloopConfig
from tryloop.sandbox import SandboxRuntime
from tryloop.tasks.factory import bundled_projects, multifile_bugs, multifile_task
from tryloop.tasks.model import Task
from tryloop.tasks.sources.humaneval import humaneval_task, load_humaneval
from tryloop.tasks.testrun import run_tests

LEVELS = (1, 2)   # 1 first: it is the level measured beside the bare runs


def bench_tasks(work: Path, *, multifile: int | None, humaneval: int) -> list[Task]:
    projects = {p.name: p for p in bundled_projects()}
    tasks = [multifile_task(projects[b["project"]], b, work / "multifile")
             for b in multifile_bugs()[:multifile]]
    tasks += [humaneval_task(p, work / "humaneval" / str(i)) for i, p in enumerate(load_humaneval()[:humaneval])]
    return tasks


def seconds_in_tests(traj: Trajectory) -> float:
    """Time the episode spent running the task's tests: the oracle's own run and the verifier's."""
    own = sum(o.env_s for turn in traj.turns for o in turn.observations if o.name == "shell")
    return own + traj.times.get("tests_in_verify", 0.0)


def _row(xs: list[float]) -> dict:
    return {"p50_s": round(pct(xs, 50), 4), "p99_s": round(pct(xs, 99), 4), "mean_s": round(statistics.fmean(xs), 4)}


def _level(trajs: list[Trajectory], wall: float) -> dict:
    total = [t.times["total"] for t in trajs]
    tests = [seconds_in_tests(t) for t in trajs]
    mean = lambda f: round(statistics.fmean(f(t) for t in trajs), 4)  # noqa: E731
    shell = lambda t: sum(o.env_s for turn in t.turns for o in turn.observations if o.name == "shell")  # noqa: E731
    return {
        "episodes": len(trajs), "wall_s": round(wall, 3), "episodes_per_s": round(len(trajs) / wall, 3),
        "latency": _row(total),
        "overhead_share": round(1 - sum(tests) / sum(total), 4),
        "overhead_share_p50": round(pct([1 - s / t for s, t in zip(tests, total, strict=True)], 50), 4),
        # Where an episode's seconds go, on average (tests first, then tryloop's parts).
        "breakdown_mean_s": {
            "tests_agent": mean(shell), "tests_verifier": mean(lambda t: t.times["tests_in_verify"]),
            "other_tools": mean(lambda t: t.times["env"] - shell(t)),
            "verifier_rest": mean(lambda t: t.times["verify"] - t.times["tests_in_verify"]),
            "loop_rest": mean(lambda t: t.times["episode"] - t.times["env"] - t.times["model"]),
            "policy": mean(lambda t: t.times["model"]),
        },
        "verdicts": {v: sum(t.verdict == v for t in trajs) for v in sorted({str(t.verdict) for t in trajs})},
    }


async def _alone(rt: SandboxRuntime, envs: Environments, oracle: Oracle, tasks: list[Task], rounds: int,
                 bare: dict[str, list[float]], bare_pytest: list[float]) -> tuple[list[Trajectory], float]:
    """Concurrency 1, each episode next to a bare run of the same task (the order alternating by
    round), so a busy neighbour weighs on both sides alike. Returns the episodes and their wall time."""
    trajs, wall = [], 0.0
    for r in range(rounds):
        for t in tasks:
            for side in ("episode", "bare") if r % 2 == 0 else ("bare", "episode"):
                t0 = time.perf_counter()
                if side == "episode":
                    trajs.append(await run_episode(EpisodeRequest(f"c1-r{r}-{t.id}", t, sample_index=r), oracle, envs))
                    wall += time.perf_counter() - t0
                else:
                    run = await run_tests(rt, t, with_solution=True)
                    bare[t.id].append(time.perf_counter() - t0)
                    bare_pytest.append(run.wall_s)
    return trajs, wall


async def _side_by_side(envs: Environments, oracle: Oracle, reqs: list[EpisodeRequest],
                        level: int) -> list[Trajectory]:
    slots = asyncio.Semaphore(level)

    async def one(req: EpisodeRequest) -> Trajectory:
        async with slots:
            return await run_episode(req, oracle, envs)

    return list(await asyncio.gather(*(one(q) for q in reqs)))


async def _measure(rt: SandboxRuntime, tasks: list[Task], rounds: int) -> dict:
    oracle = Oracle()
    envs = Environments(rt)
    bare: dict[str, list[float]] = {t.id: [] for t in tasks}
    bare_pytest: list[float] = []
    levels, load = {}, {}
    try:
        for t in tasks:  # warm-up, untimed: snapshots, pools, the verifier's baseline run
            w = await run_episode(EpisodeRequest(f"warm-{t.id}", t), oracle, envs)
            if w.verdict != "pass":
                raise RuntimeError(f"warm-up: the oracle did not pass {t.id}: {w.verdict_reason}")
        alone, wall = await _alone(rt, envs, oracle, tasks, rounds, bare, bare_pytest)
        levels["1"], load["1"] = _level(alone, wall), [round(x, 2) for x in os.getloadavg()]
        for level in LEVELS[1:]:
            # Round-robin over tasks, so episodes side by side are mostly of different tasks.
            reqs = [EpisodeRequest(f"c{level}-r{r}-{t.id}", t, sample_index=r) for r in range(rounds) for t in tasks]
            t0 = time.perf_counter()
            trajs = await _side_by_side(envs, oracle, reqs, level)
            levels[str(level)] = _level(trajs, time.perf_counter() - t0)
            load[str(level)] = [round(x, 2) for x in os.getloadavg()]
    finally:
        await envs.close()
    by_task: dict[str, list[Trajectory]] = {t.id: [] for t in tasks}
    for traj in alone:
        by_task[traj.task_id].append(traj)
    all_bare = [x for xs in bare.values() for x in xs]
    single = levels["1"]["latency"]
    per_task = []
    for t in tasks:
        ep = [x.times["total"] for x in by_task[t.id]]
        tests = sum(seconds_in_tests(x) for x in by_task[t.id])
        per_task.append({"task": t.id, "bare_p50_s": round(pct(bare[t.id], 50), 4),
                         "episode_p50_s": round(pct(ep, 50), 4),
                         "ratio_p50": round(pct(ep, 50) / pct(bare[t.id], 50), 3),
                         "overhead_share": round(1 - tests / sum(ep), 4)})
    return {"tasks": [t.id for t in tasks], "rounds": rounds, "cpus": os.cpu_count(),
            "load_avg_after_level": load,
            "levels": levels,
            "bare": {**_row(all_bare), "pytest_only_p50_s": round(pct(bare_pytest, 50), 4)},
            "ratio_p50": round(single["p50_s"] / pct(all_bare, 50), 3),
            "ratio_p99": round(single["p99_s"] / pct(all_bare, 99), 3),
            "per_task": per_task}


def run(cfg: TryloopConfig, *, quick: bool, out: Path | None, console: Console) -> dict:
    rounds, multifile, humaneval = (1, 2, 1) if quick else (3, None, 4)
    rt = SandboxRuntime(cfg.runtime)
    with tempfile.TemporaryDirectory() as tmp, console.status("oracle episodes vs bare test runs ..."):
        tasks = bench_tasks(Path(tmp), multifile=multifile, humaneval=humaneval)
        res = asyncio.run(_measure(rt, tasks, rounds))
    t = Table(title=f"oracle episodes ({len(res['tasks'])} tasks x {rounds} rounds) vs bare test runs")
    for col in ("", "episodes/s", "p50", "p99", "tryloop share", "verdicts"):
        t.add_column(col)
    for level, r in res["levels"].items():
        lat = r["latency"]
        t.add_row(f"episodes, {level} at once", f"{r['episodes_per_s']:.2f}", f"{lat['p50_s'] * 1000:.0f} ms",
                  f"{lat['p99_s'] * 1000:.0f} ms", f"{r['overhead_share']:.1%}",
                  ", ".join(f"{k}: {v}" for k, v in r["verdicts"].items()))
    b = res["bare"]
    t.add_row("bare run_tests", f"{1 / b['mean_s']:.2f}", f"{b['p50_s'] * 1000:.0f} ms", f"{b['p99_s'] * 1000:.0f} ms",
              "", "")
    t.add_row("[bold]ratio episode / bare", "", f"[bold]{res['ratio_p50']:.2f}x", f"[bold]{res['ratio_p99']:.2f}x",
              "", "")
    console.print(t)
    split = Table(title="where an episode's time goes (concurrency 1, mean per episode)")
    split.add_column("part")
    split.add_column("seconds")
    for part, s in res["levels"]["1"]["breakdown_mean_s"].items():
        split.add_row(part, f"{s:.3f}")
    console.print(split)
    per = Table(title="per task (concurrency 1)")
    for col in ("task", "bare p50", "episode p50", "ratio", "tryloop share"):
        per.add_column(col)
    for r in res["per_task"]:
        per.add_row(r["task"], f"{r['bare_p50_s'] * 1000:.0f} ms", f"{r['episode_p50_s'] * 1000:.0f} ms",
                    f"{r['ratio_p50']:.2f}x", f"{r['overhead_share']:.1%}")
    console.print(per)
    if out:
        out.write_text(json.dumps(res, indent=1))
    return res
