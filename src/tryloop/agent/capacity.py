"""The episode's view of shared capacity: where the scheduler co-schedules inference and execution.

An episode holds an inference permit only while the model generates and an
execution slot only while a tool or the verifier runs, so a scheduler can overlap
GPU-bound generation with CPU-bound test runs. Without a scheduler, `Unlimited`.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Protocol


class Capacity(Protocol):
    def inference(self, endpoint: str = "default") -> AbstractAsyncContextManager[None]: ...
    def execution(self) -> AbstractAsyncContextManager[None]: ...


class Unlimited:
    @asynccontextmanager
    async def inference(self, endpoint: str = "default"):
        yield

    @asynccontextmanager
    async def execution(self):
        yield
