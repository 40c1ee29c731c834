"""`tryloop serve env`: the task store's tasks as environments over HTTP and WebSocket.
`tryloop serve model`: the local model's OpenAI-compatible server."""

from __future__ import annotations

from typing import Annotated

import typer

from tryloop.cli.main import ConfigOpt, console, field_help, load_config, run_cli

app = typer.Typer(help="Servers (see docs/serve.md).", no_args_is_help=True)


_help = field_help


def _serve(cfg) -> None:
    from tryloop.serve.asgi import bearer_token
    from tryloop.serve.server import serve, served_tasks

    scfg = cfg.serve.env
    bearer_token(scfg.auth_token_env)     # a missing token is named before any work
    tasks = served_tasks(cfg)

    def ready(url: str) -> None:
        auth = f"bearer token from ${scfg.auth_token_env}" if scfg.auth_token_env else "no auth"
        console.print(f"[bold]serving {len(tasks)} task(s)[/] at {url} (WebSocket {url.replace('http', 'ws', 1)}/ws), "
                      f"{scfg.max_sessions} sessions at most, {auth}; metrics at {url}/metrics. Ctrl-C stops.")

    serve(cfg, tasks, on_ready=ready)


@app.command("env")
def serve_env(
    host: Annotated[str | None, typer.Option("--host", help=_help("serve.env.host"))] = None,
    port: Annotated[int | None, typer.Option("--port", help=_help("serve.env.port"))] = None,
    split: Annotated[str | None, typer.Option("--split", help=_help("serve.env.split"))] = None,
    source: Annotated[str | None, typer.Option("--source", help=_help("serve.env.source"))] = None,
    max_sessions: Annotated[int | None, typer.Option("--max-sessions", help=_help("serve.env.max_sessions"))] = None,
    pool_per_task: Annotated[int | None, typer.Option("--pool-per-task",
                                                      help=_help("serve.env.pool_per_task"))] = None,
    idle_timeout: Annotated[float | None, typer.Option("--idle-timeout",
                                                       help=_help("serve.env.idle_timeout_s"))] = None,
    grace: Annotated[float | None, typer.Option("--disconnect-grace",
                                                help=_help("serve.env.disconnect_grace_s"))] = None,
    auth_token_env: Annotated[str | None, typer.Option("--auth-token-env",
                                                       help=_help("serve.env.auth_token_env"))] = None,
    access_log: Annotated[str | None, typer.Option("--access-log", help=_help("serve.env.access_log"))] = None,
    record: Annotated[bool | None, typer.Option("--record/--no-record", help=_help("serve.env.record"))] = None,
    run_id: Annotated[str | None, typer.Option("--run-id", help=_help("serve.env.run_id"))] = None,
    max_turns: Annotated[int | None, typer.Option("--max-turns", help=_help("serve.env.limits.max_turns"))] = None,
    wall_time: Annotated[float | None, typer.Option("--wall-time", help=_help("serve.env.limits.wall_time_s"))] = None,
    store: Annotated[str | None, typer.Option("--store", help=_help("tasks.store_url"))] = None,
    config: ConfigOpt = None,
) -> None:
    """Serve the task store's tasks as environments: one episode per WebSocket session, actions are
    tool calls, `done` carries the verifier's verdict (docs/serve.md)."""
    cfg = run_cli(load_config, config, {
        "serve.env.host": host, "serve.env.port": port, "serve.env.split": split, "serve.env.source": source,
        "serve.env.max_sessions": max_sessions, "serve.env.pool_per_task": pool_per_task,
        "serve.env.idle_timeout_s": idle_timeout, "serve.env.disconnect_grace_s": grace,
        "serve.env.auth_token_env": auth_token_env, "serve.env.access_log": access_log,
        "serve.env.record": record, "serve.env.run_id": run_id,
        "serve.env.limits.max_turns": max_turns, "serve.env.limits.wall_time_s": wall_time,
        "tasks.store_url": store})
    run_cli(_serve, cfg)


def _serve_model(cfg) -> None:
    from tryloop.serve.model import serve_model

    mcfg = cfg.serve.model

    def ready(url: str, loaded) -> None:
        auth = f"API key from ${mcfg.auth_token_env}" if mcfg.auth_token_env else "no auth"
        console.print(f"[bold]serving {mcfg.served_name or mcfg.model}[/] ({loaded.weights_version}) at {url}/v1 "
                      f"(OpenAI-compatible), {mcfg.max_batch} sequences per batch, {auth}"
                      f"{', new weights on POST /v1/weights' if mcfg.weight_updates else ''}; metrics at "
                      f"{url}/metrics. Ctrl-C stops.")

    serve_model(mcfg, on_ready=ready)


@app.command("model")
def serve_model_cmd(
    model: Annotated[str | None, typer.Option("--model", help=_help("serve.model.model"))] = None,
    served_name: Annotated[str | None, typer.Option("--served-name", help=_help("serve.model.served_name"))] = None,
    host: Annotated[str | None, typer.Option("--host", help=_help("serve.model.host"))] = None,
    port: Annotated[int | None, typer.Option("--port", help=_help("serve.model.port"))] = None,
    device: Annotated[str | None, typer.Option("--device", help=_help("serve.model.device"))] = None,
    dtype: Annotated[str | None, typer.Option("--dtype", help=_help("serve.model.dtype"))] = None,
    max_batch: Annotated[int | None, typer.Option("--max-batch", help=_help("serve.model.max_batch"))] = None,
    threads: Annotated[int | None, typer.Option("--threads", help=_help("serve.model.threads"))] = None,
    logprobs_mode: Annotated[str | None, typer.Option("--logprobs-mode",
                                                      help=_help("serve.model.logprobs_mode"))] = None,
    default_max_tokens: Annotated[int | None, typer.Option("--default-max-tokens",
                                                           help=_help("serve.model.default_max_tokens"))] = None,
    max_body_bytes: Annotated[int | None, typer.Option("--max-body-bytes",
                                                       help=_help("serve.model.max_body_bytes"))] = None,
    auth_token_env: Annotated[str | None, typer.Option("--auth-token-env",
                                                       help=_help("serve.model.auth_token_env"))] = None,
    access_log: Annotated[str | None, typer.Option("--access-log", help=_help("serve.model.access_log"))] = None,
    weight_updates: Annotated[bool | None, typer.Option("--weight-updates/--no-weight-updates",
                                                        help=_help("serve.model.weight_updates"))] = None,
    max_weights_bytes: Annotated[int | None, typer.Option("--max-weights-bytes",
                                                          help=_help("serve.model.max_weights_bytes"))] = None,
    config: ConfigOpt = None,
) -> None:
    """Serve the local model (the bundled one, a checkpoint or a hub id) over the OpenAI API:
    chat and text completions, streaming, token ids and log-probabilities, Prometheus /metrics
    (docs/serve.md)."""
    cfg = run_cli(load_config, config, {
        "serve.model.model": model, "serve.model.served_name": served_name, "serve.model.host": host,
        "serve.model.port": port, "serve.model.device": device, "serve.model.dtype": dtype,
        "serve.model.max_batch": max_batch, "serve.model.threads": threads,
        "serve.model.logprobs_mode": logprobs_mode, "serve.model.default_max_tokens": default_max_tokens,
        "serve.model.max_body_bytes": max_body_bytes, "serve.model.auth_token_env": auth_token_env,
        "serve.model.access_log": access_log, "serve.model.weight_updates": weight_updates,
        "serve.model.max_weights_bytes": max_weights_bytes})
    run_cli(_serve_model, cfg)
