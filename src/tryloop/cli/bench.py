"""`tryloop bench ...`: benchmarks measured side by side with their baselines."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tryloop.cli.main import ConfigOpt, console, load_config, run_cli

app = typer.Typer(help="Benchmarks (see benchmarks/README.md).", no_args_is_help=True)


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
