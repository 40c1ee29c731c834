"""Evaluate a policy over a split of the task store: k samples per task, bounded concurrency.

Every finished trajectory is written to the trajectory store before it is
counted (docs/architecture.md, invariant 7); a rerun with the same run id skips episodes
already stored, so an interrupted evaluation continues where it stopped.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tryloop.agent.episode import EpisodeRequest, run_episode
from tryloop.agent.trajectory import Trajectory
from tryloop.errors import TryloopError
from tryloop.eval.config import EvalConfig
from tryloop.eval.runner import BoundedRunner, EpisodeRunner
from tryloop.eval.summary import EvalSummary, report, summarize
from tryloop.tasks.model import Task


def select_tasks(store, cfg: EvalConfig) -> list[Task]:
    entries = store.query(split=None if cfg.split == "all" else cfg.split, source=cfg.source)
    if not entries:
        raise TryloopError(f"no {cfg.split} tasks{f' of source {cfg.source}' if cfg.source else ''} in the "
                           f"task store at {store.url}: build it with `tryloop tasks build-default`")
    entries = sorted(entries, key=lambda e: hashlib.sha256(f"{cfg.seed}:{e.fingerprint}".encode()).digest())
    return [store.get(e.fingerprint) for e in entries[: cfg.max_tasks]]


def episode_id(run_id: str, task: Task, sample: int, step: int = 0) -> str:
    return f"{run_id}:{step}:{task.fingerprint()[:16]}:{sample}"


@dataclass
class EvalResult:
    run_id: str
    summary: EvalSummary
    trajectories: list[Trajectory]
    report_path: Path | None
    skipped: int          # episodes already stored by an earlier attempt of this run


async def evaluate(tasks: list[Task], policy, envs, *, cfg: EvalConfig, run_id: str, store=None,
                   runner: EpisodeRunner | None = None, spec=None, out_dir: Path | None = None,
                   on_done: Callable[[Trajectory], None] | None = None,
                   on_start: Callable[[int, int], None] | None = None) -> EvalResult:
    """Run k episodes per task; returns the summary and writes the report (when `out_dir`).
    `on_start(to_run, stored)`: the episodes this call will run and those an earlier attempt stored
    (a progress bar's total), before the first one runs; `on_done` after each."""
    done_ids = store.episode_ids(run_id) if store is not None else set()
    earlier = store.read(run_id=run_id) if store is not None and done_ids else []
    requests = [EpisodeRequest(episode_id(run_id, t, i), t, sample_index=i, run_id=run_id, step=0,
                               seed=cfg.seed * 1_000_003 + i, group_id=f"0:{t.id}")
                for t in tasks for i in range(cfg.k)]
    todo = [r for r in requests if r.episode_id not in done_ids]
    runner = runner or BoundedRunner(cfg.concurrency)
    out: list[Trajectory] = list(earlier)
    if on_start:
        on_start(len(todo), len(requests) - len(todo))

    async def one(req: EpisodeRequest, hooks) -> Trajectory:
        return await run_episode(req, policy, envs, limits=cfg.limits, spec=spec, hooks=hooks)

    async for traj in runner.run(todo, one):
        if store is not None:
            await asyncio.to_thread(store.write, [traj])  # durable before counted
        out.append(traj)
        if on_done:
            on_done(traj)
    summary = summarize(out, k=cfg.k, policy=getattr(policy, "name", ""))
    sched = getattr(runner, "summary", None)
    if sched:
        summary.extra["scheduler"] = sched
        summary.extra.setdefault("tables", {})["Scheduler"] = scheduler_rows(sched)
        summary.extra["failed_episodes"] = [{"id": o.id, "failure": str(o.failure)} for o in runner.failed]
    path = None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "summary.json").write_text(json.dumps(summary.to_dict(), indent=1, default=str))
        path = report(summary, f"Evaluation {run_id}").write(out_dir / "report.html")
    return EvalResult(run_id, summary, out, path, len(requests) - len(todo))


def scheduler_rows(s: dict) -> list[list[str]]:
    """The scheduler's summary as rows a report can show (stage latency, retries, failures, breakers)."""
    rows = [["engine", s.get("engine", "")], ["finished", json.dumps(s.get("finished", {}))],
            ["retries by type", json.dumps(s.get("retries", {})) or "{}"],
            ["failures by kind", json.dumps(s.get("failures", {})) or "{}"],
            ["quarantined tasks", str(len(s.get("quarantined_tasks", {})))],
            ["breakers", ", ".join(f"{k}: {v['state']}" for k, v in s.get("breakers", {}).items()) or "-"],
            ["admission limit", str(s.get("admission", {}).get("limit"))]]
    for stage, st in s.get("stage_seconds", {}).items():
        rows.append([f"{stage} seconds", ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                                                    for k, v in st.items())])
    return rows


def default_run_id(cfg: EvalConfig) -> str:
    name = cfg.policy.name.replace("/", "-").replace(":", "-")
    return f"eval-{name}-{cfg.split}-{time.strftime('%Y%m%d-%H%M%S')}"
