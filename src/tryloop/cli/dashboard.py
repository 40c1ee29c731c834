"""`tryloop dashboard`: a live web page over runs and their episodes (docs/dashboard.md)."""

from __future__ import annotations

from typing import Annotated

import typer

from tryloop.cli.main import ConfigOpt, console, field_help, load_config, run_cli

_help = field_help


def _serve(cfg) -> None:
    from tryloop.serve.asgi import bearer_token
    from tryloop.serve.dashboard import serve_dashboard

    dcfg = cfg.serve.dashboard
    bearer_token(dcfg.auth_token_env, "serve.dashboard.auth_token_env")   # a missing token is named first

    def ready(url: str) -> None:
        auth = f"bearer token from ${dcfg.auth_token_env}" if dcfg.auth_token_env else "no auth"
        console.print(f"[bold]dashboard[/] at {url}/ over runs in {cfg.store.runs_dir} and episodes in "
                      f"{cfg.store.trajectories_url}, {auth}. Ctrl-C stops.")

    serve_dashboard(cfg, on_ready=ready)


def dashboard_cmd(
    host: Annotated[str | None, typer.Option("--host", help=_help("serve.dashboard.host"))] = None,
    port: Annotated[int | None, typer.Option("--port", help=_help("serve.dashboard.port"))] = None,
    runs_dir: Annotated[str | None, typer.Option("--runs-dir", help=_help("store.runs_dir"))] = None,
    trajectories: Annotated[str | None, typer.Option("--trajectories",
                                                     help=_help("store.trajectories_url"))] = None,
    tasks: Annotated[str | None, typer.Option("--tasks", help=_help("tasks.store_url"))] = None,
    refresh: Annotated[float | None, typer.Option("--refresh", help=_help("serve.dashboard.refresh_s"))] = None,
    auth_token_env: Annotated[str | None, typer.Option("--auth-token-env",
                                                       help=_help("serve.dashboard.auth_token_env"))] = None,
    access_log: Annotated[str | None, typer.Option("--access-log",
                                                   help=_help("serve.dashboard.access_log"))] = None,
    metrics_url: Annotated[list[str] | None, typer.Option("--metrics-url",
                                                          help=_help("serve.dashboard.metrics_urls")
                                                          + "; repeat for several")] = None,
    config: ConfigOpt = None,
) -> None:
    """A live web page over runs (train, eval, serve): learning curves with intervals, the time split
    of each step, scheduler and pool state, flags, and every episode's turns, tool calls, diff and
    verdict (docs/dashboard.md)."""
    cfg = run_cli(load_config, config, {
        "serve.dashboard.host": host, "serve.dashboard.port": port, "store.runs_dir": runs_dir,
        "store.trajectories_url": trajectories, "tasks.store_url": tasks, "serve.dashboard.refresh_s": refresh,
        "serve.dashboard.auth_token_env": auth_token_env, "serve.dashboard.access_log": access_log,
        "serve.dashboard.metrics_urls": metrics_url or None})
    run_cli(_serve, cfg)
