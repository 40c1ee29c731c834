"""`tryloop train`: the RL loop on embedded defaults (CPU, SmolLM2-135M, the function tasks in its learning
zone, HumanEval as the regression check, local sandboxes)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Annotated, Any

import typer
from rich.live import Live
from rich.table import Table

from tryloop.cli.main import ConfigOpt, console, load_config, run_cli, task_store
from tryloop.cli.progress import is_live, task_progress


def ensure_suite(cfg, builders: dict[str, Callable[..., Any]] | None = None,
                 keys: dict[str, str | None] | None = None) -> None:
    """Build the tasks the run needs unless the store has them: the synthesized function tasks (the
    default train source) and HumanEval (the default check set), each gated once with K=1.

    A build admits task by task and records in the store that it started, that it finished and
    what it was built from (`keys`: source -> the builder's key, default `default_build_key`). A
    build that was killed resumes where it stopped, gating only the tasks it had not decided
    (instead of training on the part it had stored); a finished build whose source has changed since
    (this release adds templates) gates only the tasks the store lacks. A source whose tasks are in
    the store with no build recorded was built by hand (`tryloop tasks build ...`) and is used as it
    is. `builders` (source -> builder) defaults to the factory's.
    """
    from tryloop.errors import TryloopError
    from tryloop.sandbox import SandboxRuntime
    from tryloop.tasks.factory import build_functions, build_humaneval, default_build_key
    from tryloop.tasks.gate import GateConfig

    builders = builders or {"functions": build_functions, "humaneval": build_humaneval}
    store = task_store(cfg)
    needed = [(cfg.train.source, "train", "train.source")] + (
        [(cfg.train.check_source, "eval", "train.check_source")] if cfg.train.check_source else [])
    for source, split, field in needed:
        state = store.build_state(source) if source else None
        key = keys.get(source) if keys is not None else default_build_key(source or "", cfg.tasks.seed)
        current = state == "done" and (key is None or store.build_key(source) == key)
        if current or (state is None and store.query(split=split, source=source)):
            continue
        if source not in builders:
            known = sorted(set(builders) | {e.meta.source for e in store.entries() if e.meta.source})
            raise TryloopError(f"{field}: no {split} tasks{f' of source {source!r}' if source else ''} in "
                               f"{cfg.tasks.store_url}, and tryloop train builds only "
                               f"{' and '.join(sorted(builders))} itself: build them with `tryloop tasks "
                               f"build ...`, or choose a source the store has or train builds "
                               f"({', '.join(known)})")
        skip = store.decided_ids(source) if state else set()
        if state == "started" and skip:
            console.print(f"resuming the interrupted build of the {source} tasks: {len(skip)} already decided")
        elif state == "done":
            console.print(f"the {source} tasks of this release differ from the store's build: gating the ones "
                          f"it lacks ({len(skip)} decided before are kept)")
        store.set_build_state(source, "started", key)
        cfg.tasks.work_dir.mkdir(parents=True, exist_ok=True)
        with task_progress(console) as prog:
            bar = prog.add_task(f"building the {source} tasks (gated)", total=None, last="")
            report = asyncio.run(builders[source](
                SandboxRuntime(cfg.runtime), store, cfg.tasks.work_dir,
                gate=GateConfig(k=1, time_budget_s=cfg.tasks.time_budget_s),
                eval_fraction=cfg.tasks.eval_fraction_for(source), seed=cfg.tasks.seed, skip=skip,
                progress=lambda tid, _, bar=bar, prog=prog: prog.update(bar, advance=1, last=tid)))
        store.set_build_state(source, "done", key)
        console.print(f"task store: {report.total_kept} {source} tasks kept, {report.total_rejected} rejected"
                      + (f" ({len(skip)} decided before)" if skip else ""))


def ensure_gate(cfg) -> None:
    """Run the reward regression gate once for this reward version (the run then requires it)."""
    import typer as _typer

    from tryloop.cli.reward import run_gate_cli
    from tryloop.rewards.gold import GateRecords
    from tryloop.rewards.version import spec_version
    from tryloop.sandbox import SandboxRuntime

    ver = spec_version(cfg.rewards.spec, SandboxRuntime(cfg.runtime).host_image().id)
    if GateRecords(cfg.rewards.gate_dir).load(ver) is not None:
        return
    console.print(f"reward version {ver} has no gate record: running the regression gate")
    out = run_gate_cli(cfg)
    if not out.approved:
        console.print(out.report())
        raise _typer.Exit(1)
    console.print(f"[green]gate approved[/] {len(out.results)} gold items in {out.wall_s:.0f}s")


def _step_cells(m: dict) -> dict[str, str]:
    """A step's figures as text, for the table's row and a log's line alike."""
    f = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
    return {"episodes": str(m["episodes"]), "mixed": f"{m.get('groups_mixed', '-')}/{m['groups']}",
            "refills": str(m.get("refills", "-")), "reward": f(m["reward_mean"]), "pass": f(m["pass_rate"]),
            "loss": f(m.get("learn_loss")), "rollout": f"{m.get('time_rollout_wall_s', 0):.0f}",
            "update": f"{m['time_update_s']:.0f}"}


def _at(step: int) -> str:
    """When an evaluation ran: before training (step -1) or after a step."""
    return "start" if step < 0 else f"step {step}"


def _summary(rows: list[dict], evals: list[dict], status: str) -> Table:
    t = Table(title=f"training — {status}")
    for col in ("step", "episodes", "mixed", "refills", "reward", "pass", "held-out pass@1", "loss", "rollout s",
                "update s"):
        t.add_column(col, justify="right")
    ev = {e["step"]: e for e in evals if e.get("name", "held-out") == "held-out"}
    if -1 in ev:
        e = ev[-1]
        t.add_row("start", "", "", "", "", "", f"{e['pass_at_1']:.1%}" if e["pass_at_1"] is not None else "-", "",
                  "", "")
    for m in rows[-12:]:
        e, c = ev.get(m["step"]), _step_cells(m)
        t.add_row(str(m["step"]), c["episodes"], c["mixed"], c["refills"], c["reward"], c["pass"],
                  f"{e['pass_at_1']:.1%} [{e['lo']:.0%},{e['hi']:.0%}]" if e and e["pass_at_1"] is not None else "",
                  c["loss"], c["rollout"], c["update"])
    return t


def _step_line(m: dict) -> str:
    c = _step_cells(m)
    return (f"step {m['step']}: {c['episodes']} episodes, {c['mixed']} groups mixed, {c['refills']} refills, "
            f"reward {c['reward']}, pass {c['pass']}, loss {c['loss']}, rollouts {c['rollout']} s, "
            f"update {c['update']} s")


def _eval_line(e: dict) -> str:
    head = f"{e.get('name', 'held-out')} eval ({_at(e['step'])})"
    if e["pass_at_1"] is None:
        return f"{head}: no verdicts"
    return f"{head}: pass@1 {e['pass_at_1']:.1%} [{e['lo']:.0%}, {e['hi']:.0%}]"


def _zone_table(rows: list[dict], n_train: int, n_eval: int) -> Table:
    t = Table(title=f"learning zone: {n_train} train / {n_eval} held-out tasks")
    for col in ("group", "split", "tasks", "mean pass rate", "never", "always", "in zone"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(r["group"], r["split"], str(r["tasks"]),
                  "-" if r["mean_rate"] is None else f"{r['mean_rate']:.0%}", str(r["never"]), str(r["always"]),
                  str(r["in_zone"]))
    return t


def _run(cfg, resume: bool) -> None:
    from tryloop.train.run import check_start, train

    check_start(cfg, cfg.train, resume)     # a refused start builds nothing and draws no table
    ensure_suite(cfg)
    ensure_gate(cfg)
    rows: list[dict] = []
    evals: list[dict] = []
    tc = cfg.train
    prog = task_progress(console)
    bar = prog.add_task("rollouts", total=tc.tasks_per_step * tc.group_size, last="")
    # Evaluations count on a bar of their own: with train.overlap the next step's rollouts run
    # while an evaluation does.
    ebar = prog.add_task("evaluation", total=None, last="", visible=False)

    def render():
        from rich.console import Group

        return Group(_summary(rows, evals, f"run {tc.run_id}"), prog)

    # In a terminal, a live table of steps over the bar. A log gets no live display (rich would
    # write it once, at the end): there each step and evaluation is a line as it ends, the bar
    # logs its own lines, and the table is written once when the run stops.
    live = Live(render(), console=console, refresh_per_second=4) if is_live(console) else None

    def hook(event: str, data: dict) -> None:
        if event == "zone_start":
            kept = f" ({data['stored']} episodes kept from before)" if data["stored"] else ""
            prog.reset(bar, total=data["episodes"], completed=0, description=f"measuring the learning zone{kept}",
                       last="")
        elif event in ("zone_episode", "episode", "eval_episode"):
            t = data["trajectory"]
            prog.update(ebar if event == "eval_episode" else bar, advance=1, last=f"{t.task_id}: {t.verdict}")
        elif event == "zone_done":
            console.print(_zone_table(data["rows"], data["train"], data["eval"]))
        elif event == "rollout":
            prog.reset(bar, total=data["total"], completed=data["done"],
                       description=f"step {data['step']} rollouts", last="")
        elif event == "eval_start":
            kept = f", {data['stored']} episodes kept from before" if data["stored"] else ""
            prog.reset(ebar, total=data["episodes"], completed=0,
                       description=f"{data['name']} eval ({_at(data['step'])}{kept})",
                       last="", visible=True)
        elif event == "step":
            rows.append(data)
            if live is None:
                console.print(_step_line(data), highlight=False)
        elif event == "eval":
            evals.append(data)
            prog.update(ebar, visible=False)
            if live is None:
                console.print(_eval_line(data), highlight=False)
        elif event == "log":
            console.print(data["message"])
        if live is not None:
            live.update(render())

    if live is not None:
        live.start()
    try:
        res = asyncio.run(train(cfg, tc, resume=resume, hook=hook))
    finally:
        if live is not None:
            live.stop()
        else:
            prog.stop()
            if rows or evals:
                console.print(_summary(rows, evals, f"run {tc.run_id}"))
    console.print(f"report: {res.report_path}")


def train_cmd(
    resume: Annotated[bool, typer.Option("--resume", help="continue the run from its last checkpoint")] = False,
    run_id: Annotated[str | None, typer.Option("--run-id", help="train.run_id")] = None,
    steps: Annotated[int | None, typer.Option("--steps", help="train.steps")] = None,
    tasks_per_step: Annotated[int | None, typer.Option("--tasks-per-step", help="train.tasks_per_step")] = None,
    group_size: Annotated[int | None, typer.Option("--group-size", help="train.group_size")] = None,
    source: Annotated[str | None, typer.Option("--source", help="train.source")] = None,
    model: Annotated[str | None, typer.Option("--model", help="train.policy.name")] = None,
    lr: Annotated[float | None, typer.Option("--lr", help="train.algo.lr")] = None,
    lora: Annotated[bool | None, typer.Option("--lora/--full", help="train.algo.lora")] = None,
    estimator: Annotated[str | None, typer.Option("--estimator", help="train.algo.estimator: grpo | dr_grpo | rloo")] = None,
    eval_every: Annotated[int | None, typer.Option("--eval-every", help="train.eval_every")] = None,
    eval_tasks: Annotated[int | None, typer.Option("--eval-tasks", help="train.eval_tasks")] = None,
    zone: Annotated[bool | None, typer.Option("--zone/--no-zone", help="train.zone")] = None,
    refill_groups: Annotated[int | None, typer.Option("--refill-groups", help="train.refill_groups")] = None,
    check_source: Annotated[str | None, typer.Option("--check-source", help="train.check_source")] = None,
    seed: Annotated[int | None, typer.Option("--seed", help="train.seed")] = None,
    sampler_endpoints: Annotated[list[str] | None, typer.Option(
        "--sampler-endpoint", help="train.sampler.endpoints (repeat for several): model servers to sample "
                                   "from, pushed the weights of each update")] = None,
    overlap: Annotated[bool | None, typer.Option("--overlap/--no-overlap", help="train.overlap: the next "
                                                 "step's rollouts run while this step updates")] = None,
    max_staleness: Annotated[int | None, typer.Option("--max-staleness", help="train.max_staleness")] = None,
    tis_cap: Annotated[float | None, typer.Option("--tis-cap", help="train.algo.tis_cap")] = None,
    config: ConfigOpt = None,
) -> None:
    """Train the policy with RL in sandboxes; with no arguments, the CPU default run."""
    cfg = run_cli(load_config, config, {
        "train.run_id": run_id, "train.steps": steps, "train.tasks_per_step": tasks_per_step,
        "train.group_size": group_size, "train.source": source, "train.policy.name": model,
        "train.algo.lr": lr, "train.algo.lora": lora, "train.algo.estimator": estimator,
        "train.eval_every": eval_every, "train.eval_tasks": eval_tasks, "train.seed": seed,
        "train.zone": zone, "train.refill_groups": refill_groups, "train.check_source": check_source,
        "train.sampler.endpoints": sampler_endpoints or None, "train.overlap": overlap,
        "train.max_staleness": max_staleness, "train.algo.tis_cap": tis_cap})
    run_cli(_run, cfg, resume)
