"""`tryloop bench ...`: benchmarks measured side by side with their baselines."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from tryloop.cli.main import ConfigOpt, console, load_config, run_cli

app = typer.Typer(help="Benchmarks (see benchmarks/README.md).", no_args_is_help=True)


class GenerationDtype(StrEnum):
    float32 = "float32"
    bfloat16 = "bfloat16"


@app.command("sandbox")
def sandbox_bench(
    quick: Annotated[bool, typer.Option("--quick", help="fewer iterations (a smoke run)")] = False,
    density: Annotated[int, typer.Option("--density", help="idle sandboxes held for the density test")] = 1000,
    cycles: Annotated[int, typer.Option("--cycles", help="acquire/release cycles for the leak test")] = 10000,
    out: Annotated[Path | None, typer.Option("--out", help="write results as JSON here")] = None,
    config: ConfigOpt = None,
) -> None:
    """Sandbox latency, density and leaks vs posix_spawn and bubblewrap."""
    from tryloop.bench.sandbox import run

    cfg = run_cli(load_config, config, {})
    run_cli(run, cfg, quick=quick, density=density, cycles=cycles, out=out, console=console)


@app.command("images")
def images_bench(
    quick: Annotated[bool, typer.Option("--quick", help="fewer iterations (a smoke run)")] = False,
    package: Annotated[list[str] | None, typer.Option("--package", help="Debian packages of the root (repeat; default jq)")] = None,
    out: Annotated[Path | None, typer.Option("--out", help="write results as JSON here")] = None,
    config: ConfigOpt = None,
) -> None:
    """Images: Debian root and Dockerfile build times cold and cached; create, exec, reset
    on a Debian root beside the host-derived root; disk per image."""
    from tryloop.bench.images import run

    cfg = run_cli(load_config, config, {})
    run_cli(run, cfg, quick=quick, packages=package, out=out, console=console)


@app.command("tasks")
def tasks_bench(
    quick: Annotated[bool, typer.Option("--quick", help="fewer candidates (a smoke run)")] = False,
    out: Annotated[Path | None, typer.Option("--out", help="write results as JSON here")] = None,
    config: ConfigOpt = None,
) -> None:
    """Validated tasks per minute and yield of the task factory (default gate vs K=1)."""
    from tryloop.bench.tasks import run

    cfg = run_cli(load_config, config, {})
    run_cli(run, cfg, quick=quick, out=out, console=console)


@app.command("reward")
def reward_bench(
    quick: Annotated[bool, typer.Option("--quick", help="fewer rounds (a smoke run)")] = False,
    out: Annotated[Path | None, typer.Option("--out", help="write results as JSON here")] = None,
    config: ConfigOpt = None,
) -> None:
    """Verifier latency p50/p99 against a bare pytest run of the same tests."""
    from tryloop.bench.reward import run

    cfg = run_cli(load_config, config, {})
    run_cli(run, cfg, quick=quick, out=out, console=console)


@app.command("episodes")
def episodes_bench(
    quick: Annotated[bool, typer.Option("--quick", help="3 tasks, 1 round (a smoke run)")] = False,
    out: Annotated[Path | None, typer.Option("--out", help="write results as JSON here")] = None,
    config: ConfigOpt = None,
) -> None:
    """Oracle episodes/s at concurrency 1 and 2, and the share of time that is not the tests."""
    from tryloop.bench.episodes import run

    cfg = run_cli(load_config, config, {})
    run_cli(run, cfg, quick=quick, out=out, console=console)


@app.command("serve")
def serve_bench(
    sessions: Annotated[int, typer.Option("--sessions", help="sessions open at once")] = 500,
    steps: Annotated[int, typer.Option("--steps", help="tool-call steps per session")] = 3,
    verify: Annotated[int, typer.Option("--verify", help="sessions that submit and are judged")] = 10,
    quick: Annotated[bool, typer.Option("--quick", help="20 sessions (a smoke run)")] = False,
    out: Annotated[Path | None, typer.Option("--out", help="write results as JSON here")] = None,
    config: ConfigOpt = None,
) -> None:
    """The environment server under many concurrent sessions: step latency p50/p99 beside the
    in-process API, in one run, nothing left behind."""
    from tryloop.bench.serve import run

    cfg = run_cli(load_config, config, {})
    run_cli(run, cfg, sessions=20 if quick else sessions, steps=steps, verify=min(verify, 4) if quick else verify,
            out=out, console=console)


@app.command("scheduler")
def scheduler_bench(
    quick: Annotated[bool, typer.Option("--quick", help="each measurement shrunk to seconds (a smoke run)")] = False,
    out: Annotated[Path | None, typer.Option("--out", help="write results as JSON here")] = None,
) -> None:
    """Scheduler overhead, sustained concurrency, Ray vs local, simulated GPU idle with/without admission."""
    import json

    from rich.table import Table

    from tryloop.bench.scheduler import run

    with console.status("measuring the scheduler ..."):
        res = run_cli(run, quick=quick)
    t = Table(title="scheduler", show_header=False)
    t.add_column(style="bold")
    t.add_column()
    o, c, r = res["overhead"], res["concurrency"], res["ray_vs_local"]
    t.add_row("overhead per episode", f"{o['us_per_episode']:.0f} µs ({o['us_per_episode_journaled']:.0f} µs journaled)")
    t.add_row("max concurrent episodes (one process)", f"{c['max_concurrent_sustained']:,}  ({c['criterion']})")
    t.add_row("Ray / local throughput", f"{r['ray_over_local']:.2f}x ({r['ray_episodes_per_s']:.0f} vs "
              f"{r['local_episodes_per_s']:.0f} episodes/s)")
    for name, row in res["admission"]["table"].items():
        t.add_row(f"simulated {name}", f"{row['episodes_per_hour']:,.0f} episodes/h, GPU unproductive "
                  f"{row.get('gpu_unproductive_share', row['gpu_idle_share']):.0%}")
    console.print(t)
    if out:
        out.write_text(json.dumps(res, indent=1, default=str))


@app.command("generation")
def generation_bench(
    quick: Annotated[bool, typer.Option("--quick", help="16-32 new tokens, the auto dtype only (a smoke run)")] = False,
    out: Annotated[Path | None, typer.Option("--out", help="write results as JSON here")] = None,
    run_dir: Annotated[Path | None, typer.Option(
        "--run-dir", help="also print the wall-time split of a train run's steps (DIR/metrics.jsonl)")] = None,
    dtype: Annotated[list[GenerationDtype] | None, typer.Option(
        "--dtype", help="float32 / bfloat16 (repeatable; default: both where bf16 is fast)")] = None,
    concurrency: Annotated[str, typer.Option("--concurrency", help="comma-separated levels")] = "1,8,16,32",
    threads: Annotated[int | None, typer.Option("--threads", min=1,
                                                help="torch CPU threads (default: torch's)")] = None,
    llama_server: Annotated[Path | None, typer.Option(
        "--llama-server", help="also run llama.cpp's `llama-server` binary at this path on the same requests "
                               "(the bundled GGUF, --threads threads)")] = None,
) -> None:
    """Local engine tokens/s at 1-32 concurrent sequences vs HF generate and a FLOP floor."""
    from tryloop.bench.generation import run

    try:
        levels = tuple(int(c) for c in concurrency.split(",") if c.strip())
    except ValueError:
        levels = ()
    if not levels or min(levels) < 1:
        raise typer.BadParameter(f"{concurrency!r}: comma-separated numbers of sequences, each at least 1 "
                                 "(e.g. 1,8,16,32)", param_hint="--concurrency")
    run_cli(run, quick=quick, dtypes=tuple(d.value for d in dtype) if dtype else None, concurrency=levels,
            threads=threads,
            run_dir=run_dir, llama_server=llama_server, out=out, console=console)


@app.command("train")
def train_bench(
    sim_only: Annotated[bool, typer.Option("--sim-only", help="the simulator only (seconds; a minute or two "
                                                              "for the 64-GPU presets)")] = False,
    real_only: Annotated[bool, typer.Option("--real-only", help="the real run only (minutes)")] = False,
    quick: Annotated[bool, typer.Option("--quick", help="a smoke run: 3 real steps of 2 episodes with answers of "
                                                        "up to 32 tokens; the simulator's GPU presets at 4 GPUs")] = False,
    steps: Annotated[int | None, typer.Option("--steps", help="real run: training steps (default 5; quick 3)")] = None,
    nodes: Annotated[int | None, typer.Option("--nodes", help="real run: Ray sandbox nodes (default 2)")] = None,
    tasks_per_step: Annotated[int | None, typer.Option("--tasks-per-step",
                                                       help="real run: tasks per step (default 2; quick 1)")] = None,
    group_size: Annotated[int | None, typer.Option("--group-size", help="real run: episodes per task (default 2)")] = None,
    max_new_tokens: Annotated[int | None, typer.Option("--max-new-tokens",
                                                       help="real run: answer length cap (default 64; quick 32)")] = None,
    from_real: Annotated[Path | None, typer.Option(
        "--from-real", help="the real run's results the simulator's real-run presets take their timings from "
                            "(default: this invocation's real run, else benchmarks/results-overlap.json in a checkout)")] = None,
    preset: Annotated[list[str] | None, typer.Option("--preset", help="simulator presets (repeat; default all)")] = None,
    seed: Annotated[int, typer.Option("--seed", help="the simulator's seed")] = 0,
    out: Annotated[Path | None, typer.Option(
        "--out", help="write results as JSON here (--real-only: results-overlap.json's format; --sim-only: "
                      "results-overlap-sim.json's; both: {real, sim})")] = None,
    config: ConfigOpt = None,
) -> None:
    """Synchronous vs overlapped training steps: a real `tryloop train` on a local multi-node Ray
    cluster, both modes one after the other, and the simulator's learner on presets fitted to a real
    run and on 64 sampler GPUs."""
    from tryloop.bench.train import run

    cfg = run_cli(load_config, config, {})
    settings = {"steps": steps, "nodes": nodes, "tasks_per_step": tasks_per_step, "group_size": group_size,
                "max_new_tokens": max_new_tokens}
    run_cli(run, quick=quick, sim_only=sim_only, real_only=real_only, real_settings=settings, from_real=from_real,
            presets=tuple(preset) if preset else None, seed=seed,
            runtime=cfg.runtime.model_dump(mode="json", exclude_defaults=True), out=out, console=console)
