"""Blocking wrappers over the async sandbox API, for scripts and notebooks.

A private event loop runs in a daemon thread; every call is submitted to it.
Sandboxes are bound to that loop, so use either this module or the async API
for a given sandbox, not both.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from tryloop.config import RuntimeConfig, SandboxConfig
from tryloop.sandbox.layers import Snapshot
from tryloop.sandbox.process import ExecResult
from tryloop.sandbox.runtime import SandboxRuntime
from tryloop.sandbox.sandbox import Sandbox

T = TypeVar("T")


class _Portal:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="tryloop-sync", daemon=True)
        self._thread.start()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()


class SyncSandbox:
    def __init__(self, portal: _Portal, sandbox: Sandbox):
        self._p = portal
        self.sandbox = sandbox
        self.id = sandbox.id

    def exec(self, cmd, **kwargs) -> ExecResult:
        return self._p.call(self.sandbox.exec(cmd, **kwargs))

    def reset(self) -> float:
        return self._p.call(self.sandbox.reset())

    def snapshot_state(self) -> Snapshot:
        return self._p.call(self.sandbox.snapshot_state())

    def fork(self, n: int = 1) -> list[SyncSandbox]:
        return [SyncSandbox(self._p, s) for s in self._p.call(self.sandbox.fork(n))]

    def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        return self.sandbox.read_file(path, max_bytes)

    def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        self.sandbox.write_file(path, data, mode)

    def close(self) -> None:
        self._p.call(self.sandbox.close())

    def __enter__(self) -> SyncSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncRuntime:
    """`SandboxRuntime` with blocking `create`."""

    def __init__(self, config: RuntimeConfig | None = None):
        self._p = _Portal()
        self.runtime = SandboxRuntime(config)

    def create(self, snapshot: Snapshot | None = None, config: SandboxConfig | None = None) -> SyncSandbox:
        async def make() -> Sandbox:
            return await self.runtime.create(snapshot, config)

        return SyncSandbox(self._p, self._p.call(make()))

    def workspace_snapshot(self, src, **kwargs) -> Snapshot:
        return self.runtime.workspace_snapshot(src, **kwargs)

    def close_all(self) -> None:
        self._p.call(self.runtime.close_all())
