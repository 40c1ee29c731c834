"""The `tryloop` command: a thin shell over the library."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from tryloop.cli.progress import is_live
from tryloop.config import TryloopConfig, load_yaml, parse
from tryloop.errors import TryloopError

console = Console(stderr=True)
if not is_live(console) and "COLUMNS" not in os.environ:
    # A log or a pipe: rich's default of 80 columns squeezes the result tables unreadably.
    console = Console(stderr=True, width=132)
app = typer.Typer(help="Agent RL in verifiable environments.", no_args_is_help=True,
                  pretty_exceptions_enable=False)

ConfigOpt = Annotated[Path | None, typer.Option("--config", "-c", envvar="TRYLOOP_CONFIG",
                                                help="YAML config file (see docs/config.md)")]


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"tryloop {version('tryloop')}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                                help="print the version and exit")] = False,
          debug: Annotated[bool, typer.Option("--debug", envvar="TRYLOOP_DEBUG",
                                              help="show the traceback of an error")] = False) -> None:
    """Agent RL in verifiable environments."""
    global _debug
    _debug = debug


def load_config(path: Path | None, overrides: dict[str, object]) -> TryloopConfig:
    """The YAML file (or defaults) with CLI flags applied on top; flags name config fields
    as dotted paths (e.g. "sandbox.limits.memory_mb")."""
    base = load_yaml(path) if path else TryloopConfig()
    data = base.model_dump()
    for dotted, value in overrides.items():
        if value is None:
            continue
        node = data
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = value
    flags = any(v is not None for v in overrides.values())
    source = " with ".join(x for x in (str(path) if path else "", "command-line flags" if flags else "") if x)
    return parse(TryloopConfig, data, source or "defaults", _given_flags(overrides))


def _given_flags(overrides: dict[str, object]) -> dict[str, str]:
    """The flag given on the command line that set each overridden field (by its dotted path): the
    option of the running command whose help names the field (each flag's help does)."""
    import re

    try:
        from typer._click.globals import get_current_context  # typer vendors click since 0.22
    except ImportError:  # pragma: no cover - an older typer on click itself
        from click import get_current_context

    ctx = get_current_context(silent=True)
    if ctx is None:
        return {}
    given = [p for p in ctx.command.params if p.param_type_name == "option" and p.name
             and getattr(ctx.get_parameter_source(p.name), "name", None) == "COMMANDLINE"]
    out = {}
    for dotted, value in overrides.items():
        named = re.compile(rf"(?<![\w.]){re.escape(dotted)}(?!\w|\.\w)")
        flag = next((p for p in given if value is not None and named.search(p.help or "")), None)
        if flag is not None:
            out[dotted] = max(flag.opts, key=len)
    return out


def field_help(dotted: str) -> str:
    """A flag's help: the config field it sets, its description and its default."""
    from typing import Any

    model: Any = TryloopConfig
    *parents, leaf = dotted.split(".")
    for name in parents:
        model = (model if isinstance(model, type) else type(model)).model_fields[name].default_factory()
    field = (model if isinstance(model, type) else type(model)).model_fields[leaf]
    default = getattr(model, leaf) if not isinstance(model, type) else field.get_default(call_default_factory=True)
    return f"{dotted}: {field.description or ''} (default: {default})"


#: Exit statuses besides each error class's `exit_code` (tryloop.errors).
EXIT_INTERRUPTED = 130
_debug = False


def run_cli(fn, *args, **kwargs):
    """Turn tryloop errors into a clear message and their class's exit status, without a
    traceback unless --debug (or TRYLOOP_DEBUG=1) asks for one; Ctrl-C exits 130, keeping
    what was written."""
    try:
        return fn(*args, **kwargs)
    except TryloopError as e:
        if _debug:
            raise
        console.print(f"[bold red]error:[/] {e}")
        raise typer.Exit(e.exit_code) from None
    except KeyboardInterrupt:
        if _debug:
            raise
        console.print("[bold red]interrupted[/]: what was already written is kept")
        raise typer.Exit(EXIT_INTERRUPTED) from None


def task_store(cfg: TryloopConfig, *, create: bool = True):
    """The task store (`tasks.store_url`); `create=False` for commands that only read it, so that a
    mistyped path is an error naming it rather than a new, empty store."""
    from tryloop.tasks.store import TaskStore

    return run_cli(TaskStore, cfg.tasks.store_url, create=create)


def _register() -> None:
    from tryloop.cli import (
        bench,
        dashboard,
        demo,
        evaluate,
        export,
        image,
        reward,
        sandbox,
        serve,
        tasks,
        train,
    )

    app.add_typer(sandbox.app, name="sandbox")
    app.add_typer(image.app, name="image")
    app.add_typer(tasks.app, name="tasks")
    app.add_typer(reward.app, name="reward")
    app.add_typer(bench.app, name="bench")
    app.add_typer(serve.app, name="serve")
    app.add_typer(export.app, name="export")
    app.command("demo")(demo.demo)
    app.command("eval")(evaluate.evaluate_cmd)
    app.command("train")(train.train_cmd)
    app.command("dashboard")(dashboard.dashboard_cmd)


def main() -> None:  # pragma: no cover - entry point
    app(prog_name="tryloop")
    sys.exit(0)


@app.command("config")
def show_config(config: ConfigOpt = None) -> None:
    """Print the effective configuration (defaults, then the file) as YAML."""
    import yaml

    cfg = run_cli(load_config, config, {})
    print(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False), end="")


_register()
