"""What tryloop's servers (`serve env`, `serve model`) share: bearer-token auth, a structured
access log, bodies read no further than a limit, and running a uvicorn server in the foreground
(Ctrl-C ends with its documented status) or in a background thread (tests, benchmarks)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator

import uvicorn
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from tryloop.errors import ConfigError, TryloopError


def bearer_token(cfg_env: str | None, setting: str = "serve.env.auth_token_env") -> str | None:
    """The token clients must present, read from the environment variable `cfg_env` (the value of
    the config field `setting`); None when no auth is configured."""
    if cfg_env is None:
        return None
    token = os.environ.get(cfg_env, "")
    if not token:
        raise ConfigError(f"{setting}: the environment variable {cfg_env} is unset or empty")
    return token


def authorized(headers, token: str | None) -> bool:
    """Whether `Authorization: Bearer <token>` matches (always, without a token)."""
    import hmac

    if token is None:
        return True
    scheme, _, given = headers.get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


def access_logger(dest: str | None, name: str = "tryloop.serve.access") -> logging.Logger:
    """One JSON object per line, to stderr ('-') or a file; a logger without handlers when off."""
    # A logger of this server's own (not in logging's registry): its file is closed at shutdown.
    log = logging.Logger(name, logging.INFO)
    log.propagate = False
    if dest is not None:
        handler = logging.StreamHandler(sys.stderr) if dest == "-" else logging.FileHandler(dest)
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
    else:
        log.disabled = True
    return log


class AccessLog:
    """ASGI middleware: one record per HTTP request (WebSocket messages are logged by the handler)."""

    def __init__(self, app: ASGIApp, log: logging.Logger):
        self.app, self.log = app, log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.log.disabled:
            await self.app(scope, receive, send)
            return
        t0, status = time.perf_counter(), 500

        async def send_status(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            client = scope.get("client") or ("", 0)
            self.log.info(json.dumps({"ts": round(time.time(), 3), "kind": "http", "method": scope["method"],
                                      "path": scope["path"], "status": status, "client": client[0],
                                      "ms": round((time.perf_counter() - t0) * 1000, 2)}))


class BodyTooLarge(Exception):
    """A request body over the server's limit (HTTP 413)."""

    def __init__(self, declared: int | None, limit: int):
        super().__init__(f"{declared} bytes" if declared is not None else "over the limit")
        self.declared, self.limit = declared, limit


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, read no further than `limit` bytes (a larger declared Content-Length is
    refused before reading anything)."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(int(declared), limit)
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > limit:
            raise BodyTooLarge(None, limit)
    return bytes(raw)


def server_url(server: uvicorn.Server) -> str:
    sock = server.servers[0].sockets[0]
    host, port = sock.getsockname()[:2]
    return f"http://{host}:{port}"


def run_server(server: uvicorn.Server, *, setting: str, on_ready: Callable[[str], None] | None = None) -> None:
    """Serve in the foreground until Ctrl-C or SIGTERM (a graceful shutdown first). Ctrl-C is
    re-raised as KeyboardInterrupt, so the CLI ends with its documented status (130). `setting`
    names the config fields of the address, for a port that cannot be bound."""
    cfg = server.config
    causes = _Errors()

    async def serve() -> None:
        try:
            await server.serve()
        except SystemExit:
            # uvicorn reports a socket it cannot open (a port in use, an address of no interface
            # here) by logging the OSError and calling sys.exit, which would escape asyncio.run as
            # a traceback: the check below names the field instead.
            if server.started:
                raise

    async def main() -> None:
        task = asyncio.ensure_future(serve())
        while not server.started:
            if task.done():
                break
            await asyncio.sleep(0.05)
        if server.started and on_ready is not None:
            on_ready(server_url(server))
        await task

    uvicorn_log = logging.getLogger("uvicorn.error")
    uvicorn_log.addHandler(causes)
    try:
        asyncio.run(main())
    except OSError as e:
        raise ConfigError(f"{setting}: cannot listen on {cfg.host}:{cfg.port}: {e}") from None
    finally:
        uvicorn_log.removeHandler(causes)
    # uvicorn re-raises a captured Ctrl-C after its graceful shutdown, but into asyncio.run's own
    # SIGINT handler, which loses it when the main task has already finished: say it ourselves, so
    # that Ctrl-C always ends with its documented status.
    if signal.SIGINT in getattr(server, "_captured_signals", ()):
        raise KeyboardInterrupt
    if not server.started:
        raise ConfigError(f"{setting}: cannot listen on {cfg.host}:{cfg.port}"
                          + (f": {causes.messages[-1]}" if causes.messages else ""))


class _Errors(logging.Handler):
    """The errors a logger reports (uvicorn's reason for not starting)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def server_in_thread(server: uvicorn.Server, *, what: str, timeout_s: float = 60.0) -> Iterator[str]:
    """`server` in a background thread for the block; yields its base URL, shuts it down on exit."""
    thread = threading.Thread(target=server.run, name=f"tryloop-{what}", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            thread.join(10)
            raise TryloopError(f"the {what} server did not start on {server.config.host}:{server.config.port}")
        time.sleep(0.02)
    try:
        yield server_url(server)
    finally:
        server.should_exit = True
        thread.join(60)
