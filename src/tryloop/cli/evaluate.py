"""`tryloop eval`: a policy over a split of the task store, with a live pass rate and a report."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from tryloop.cli.main import ConfigOpt, console, load_config, run_cli, task_store
from tryloop.cli.progress import task_progress


def _run(cfg) -> None:
    from tryloop.agent.environments import Environments
    from tryloop.agent.policies import make_policy
    from tryloop.eval.remote import RemoteEpisodes
    from tryloop.eval.run import default_run_id, evaluate, select_tasks
    from tryloop.eval.scheduled import ScheduledRunner, bounded
    from tryloop.eval.summary import headline
    from tryloop.sandbox import SandboxRuntime
    from tryloop.store.trajectories import TrajectoryStore
    from tryloop.telemetry.live import live_state
    from tryloop.telemetry.metrics_http import serve_metrics

    ecfg = cfg.eval
    tasks = select_tasks(task_store(cfg, create=False), ecfg)
    run_id = ecfg.run_id or default_run_id(ecfg)
    out_dir = Path(cfg.store.runs_dir) / run_id
    console.print(f"[bold]{run_id}[/]: policy {ecfg.policy.name}, {len(tasks)} {ecfg.split} task(s) x {ecfg.k}, "
                  f"{ecfg.concurrency} at once")

    async def go(metrics):
        runtime = SandboxRuntime(cfg.runtime)
        envs = Environments(runtime, registry=metrics.registry)
        if metrics.url:
            console.print(f"metrics: {metrics.url}")
        with console.status(f"loading policy {ecfg.policy.name} ..."):
            policy = await asyncio.to_thread(make_policy, ecfg.policy, ecfg.limits) \
                if cfg.scheduler.engine == "local" else None   # on Ray, the workers load it
        passed = judged = 0
        try:
            with task_progress(console, labels={"rate": "pass"}) as prog:
                bar = prog.add_task("episodes", total=len(tasks) * ecfg.k, rate="-", last="")

                def done(t):
                    nonlocal passed, judged
                    if t.verdict in ("pass", "fail"):
                        judged += 1
                        passed += t.verdict == "pass"
                    prog.update(bar, advance=1, rate=f"{passed}/{judged}" if judged else "-",
                                last=f"{t.task_id}: {t.verdict} ({t.termination})")

                # On Ray each worker builds its own sandboxes and policy from the configuration.
                remote = RemoteEpisodes(cfg, ecfg.policy, ecfg.limits) if cfg.scheduler.engine == "ray" else None
                runner = ScheduledRunner(bounded(cfg.scheduler, ecfg.concurrency), remote=remote,
                                         registry=metrics.registry)
                res = await evaluate(tasks, policy, envs, cfg=ecfg, run_id=run_id,
                                     store=TrajectoryStore(cfg.store.trajectories_url),
                                     spec=cfg.rewards.spec, out_dir=out_dir, on_done=done, runner=runner,
                                     on_start=lambda n, stored: prog.update(bar, total=n, description=(
                                         f"episodes ({stored} kept from before)" if stored else "episodes")))
                await runner.aclose()
        finally:
            await envs.close()
            close = getattr(policy, "close", None) if policy is not None else None
            if close:
                await asyncio.to_thread(close)
        return res

    out_dir.mkdir(parents=True, exist_ok=True)
    with serve_metrics(cfg.telemetry) as metrics, live_state(out_dir, metrics.registry):
        res = asyncio.run(go(metrics))
    t = Table(title=f"evaluation {run_id}", show_header=False)
    t.add_column(style="bold")
    t.add_column()
    for k, v in headline(res.summary).items():
        t.add_row(k, v)
    t.add_row("verdicts", ", ".join(f"{k}: {v}" for k, v in res.summary.verdicts.items()))
    t.add_row("terminations", ", ".join(f"{k}: {v}" for k, v in res.summary.terminations.items()))
    t.add_row("flags", ", ".join(f"{k}: {v}" for k, v in res.summary.flags.items()) or "-")
    if res.skipped:
        t.add_row("resumed", f"{res.skipped} episode(s) were already stored")
    console.print(t)
    console.print(f"report: {res.report_path}")


def evaluate_cmd(
    policy: Annotated[str | None, typer.Option("--policy", help="eval.policy.name")] = None,
    base_url: Annotated[str | None, typer.Option("--base-url", help="eval.policy.base_url")] = None,
    model: Annotated[str | None, typer.Option("--model", help="eval.policy.model")] = None,
    temperature: Annotated[float | None, typer.Option("--temperature", help="eval.policy.temperature")] = None,
    split: Annotated[str | None, typer.Option("--split", help="eval.split: train | eval | all")] = None,
    source: Annotated[str | None, typer.Option("--source", help="eval.source")] = None,
    max_tasks: Annotated[int | None, typer.Option("--max-tasks", help="eval.max_tasks")] = None,
    k: Annotated[int | None, typer.Option("-k", help="eval.k")] = None,
    concurrency: Annotated[int | None, typer.Option("--concurrency", help="eval.concurrency")] = None,
    max_turns: Annotated[int | None, typer.Option("--max-turns", help="eval.limits.max_turns")] = None,
    run_id: Annotated[str | None, typer.Option("--run-id", help="eval.run_id (reuse one to resume)")] = None,
    seed: Annotated[int | None, typer.Option("--seed", help="eval.seed")] = None,
    store: Annotated[str | None, typer.Option("--store", help="tasks.store_url")] = None,
    config: ConfigOpt = None,
) -> None:
    """Run a policy over a split of the task store: pass@1 / pass@k with intervals and an HTML report."""
    cfg = run_cli(load_config, config, {
        "eval.policy.name": policy, "eval.policy.base_url": base_url, "eval.policy.model": model,
        "eval.policy.temperature": temperature, "eval.split": split, "eval.source": source,
        "eval.max_tasks": max_tasks, "eval.k": k, "eval.concurrency": concurrency,
        "eval.limits.max_turns": max_turns, "eval.run_id": run_id, "eval.seed": seed, "tasks.store_url": store})
    run_cli(_run, cfg)
