"""Running the environment server with uvicorn: in the foreground (`tryloop serve env`) or in a
background thread (tests and `tryloop bench serve`, whose clients run in the calling thread)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import uvicorn

from tryloop.config import TryloopConfig
from tryloop.errors import TryloopError
from tryloop.serve.app import create_app
from tryloop.serve.asgi import run_server, server_in_thread
from tryloop.tasks.model import Task


def served_tasks(cfg: TryloopConfig) -> list[Task]:
    """The tasks of the store that `serve.env.split` and `serve.env.source` select."""
    from tryloop.tasks.store import TaskStore

    scfg = cfg.serve.env
    store = TaskStore(cfg.tasks.store_url, create=False)
    entries = store.query(split=None if scfg.split == "all" else scfg.split, source=scfg.source)
    if not entries:
        which = " ".join(x for x in ("" if scfg.split == "all" else scfg.split, "tasks",
                                     f"of source {scfg.source}" if scfg.source else "") if x)
        raise TryloopError(f"no {which} in the task store at {store.url} (serve.env.split, serve.env.source): "
                           "build it with `tryloop tasks build-default`")
    return [store.get(e.fingerprint) for e in entries]


def _server(cfg: TryloopConfig, tasks: list[Task]) -> uvicorn.Server:
    scfg = cfg.serve.env
    app = create_app(cfg, tasks)
    # uvicorn's own access log is off: the app writes a structured one (serve.env.access_log).
    return uvicorn.Server(uvicorn.Config(app, host=scfg.host, port=scfg.port, log_level="warning",
                                         access_log=False, ws="websockets-sansio", lifespan="on",
                                         ws_max_size=scfg.max_message_bytes, ws_ping_interval=20.0,
                                         ws_ping_timeout=20.0, timeout_graceful_shutdown=5))


def serve(cfg: TryloopConfig, tasks: list[Task], *, on_ready: Callable[[str], None] | None = None) -> None:
    """Serve until interrupted (Ctrl-C or SIGTERM: open episodes are closed, sandboxes released)."""
    run_server(_server(cfg, tasks), setting="serve.env.port", on_ready=on_ready)


@contextlib.contextmanager
def serve_in_thread(cfg: TryloopConfig, tasks: list[Task], *, timeout_s: float = 60.0) -> Iterator[str]:
    """The server in a background thread for the block; yields its base URL. On exit it shuts down
    and every sandbox it made is closed."""
    with server_in_thread(_server(cfg, tasks), what="environment", timeout_s=timeout_s) as url:
        yield url
