"""Running the environment server with uvicorn: in the foreground (`tryloop serve env`) or in a
background thread (tests and `tryloop bench serve`, whose clients run in the calling thread)."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator

import uvicorn

from tryloop.config import TryloopConfig
from tryloop.errors import ConfigError, TryloopError
from tryloop.serve.app import create_app
from tryloop.tasks.model import Task


def served_tasks(cfg: TryloopConfig) -> list[Task]:
    """The tasks of the store that `serve.env.split` and `serve.env.source` select."""
    from tryloop.tasks.store import TaskStore

    scfg = cfg.serve.env
    store = TaskStore(cfg.tasks.store_url)
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


def _url(server: uvicorn.Server) -> str:
    sock = server.servers[0].sockets[0]
    host, port = sock.getsockname()[:2]
    return f"http://{host}:{port}"


def serve(cfg: TryloopConfig, tasks: list[Task], *, on_ready: Callable[[str], None] | None = None) -> None:
    """Serve until interrupted (Ctrl-C or SIGTERM: open episodes are closed, sandboxes released)."""
    import asyncio

    server = _server(cfg, tasks)

    async def main() -> None:
        task = asyncio.ensure_future(server.serve())
        while not server.started:
            if task.done():
                break
            await asyncio.sleep(0.05)
        if server.started and on_ready is not None:
            on_ready(_url(server))
        await task

    try:
        asyncio.run(main())
    except OSError as e:
        raise ConfigError(f"serve.env.port: cannot listen on {cfg.serve.env.host}:{cfg.serve.env.port}: {e}") from None
    # uvicorn re-raises a captured Ctrl-C after its graceful shutdown, but into asyncio.run's own
    # SIGINT handler, which loses it when the main task has already finished: say it ourselves, so
    # that Ctrl-C always ends with its documented status.
    if signal.SIGINT in getattr(server, "_captured_signals", ()):
        raise KeyboardInterrupt
    if not server.started:
        raise ConfigError(f"serve.env.port: cannot listen on {cfg.serve.env.host}:{cfg.serve.env.port}")


@contextlib.contextmanager
def serve_in_thread(cfg: TryloopConfig, tasks: list[Task], *, timeout_s: float = 60.0) -> Iterator[str]:
    """The server in a background thread for the block; yields its base URL. On exit it shuts down
    and every sandbox it made is closed."""
    server = _server(cfg, tasks)
    thread = threading.Thread(target=server.run, name="tryloop-serve-env", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            thread.join(10)
            raise TryloopError(f"the environment server did not start on {cfg.serve.env.host}:{cfg.serve.env.port}")
        time.sleep(0.02)
    try:
        yield _url(server)
    finally:
        server.should_exit = True
        thread.join(60)
