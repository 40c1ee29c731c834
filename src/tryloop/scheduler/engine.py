"""Engines run attempts; the scheduler decides which, when and where.

An engine knows its sandbox hosts (name -> execution slots), places an attempt
on one (`place`, reserving a seat; `release` returns it), runs the runner for
it (`run`) and reports capacity use through the environment the scheduler
hands it at `start`. `run` returns the runner's result or raises: the
scheduler classifies the exception, so an engine only has to make sure a dead
worker surfaces as an exception and not as a hang.

`LocalEngine` runs the runner in the scheduler's own event loop;
`tryloop.scheduler.ray_engine.RayEngine` runs it in Ray actors.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from tryloop.scheduler.capacity import CapacityObserver, SharedCapacity
from tryloop.scheduler.config import SchedulerConfig, TimeoutConfig
from tryloop.scheduler.context import EpisodeContext
from tryloop.scheduler.request import EpisodeRequest, EpisodeState

R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


class Runner(Protocol[R_co]):
    """Runs one attempt of one episode. See `tryloop.scheduler.context` for the contract."""

    def __call__(self, request: EpisodeRequest, ctx: EpisodeContext) -> Awaitable[R_co]: ...


@dataclass(frozen=True)
class Attempt:
    request: EpisodeRequest
    number: int                                   # 1-based
    host: str
    timeouts: TimeoutConfig
    on_stage: Callable[[EpisodeState], None]      # the runner reported running / verifying
    cancel_requested: Callable[[], bool]          # the user cancelled (vs. a deadline or shutdown)


@dataclass(frozen=True)
class EngineEnv:
    """What the scheduler lends an engine."""

    config: SchedulerConfig
    clock: Callable[[], float]
    observer: CapacityObserver
    endpoint_open: Callable[[str], bool]          # the endpoint's breaker is open: fail requests fast
    wake: Callable[[], None]                      # hosts changed: let the dispatcher look again


class Engine(Protocol):
    name: str

    async def start(self, runner: Runner[Any], env: EngineEnv) -> None: ...

    def hosts(self) -> Mapping[str, int]:
        """Live sandbox hosts and their execution slots."""
        ...

    def place(self, usable: Callable[[str], bool]) -> str | None:
        """Reserve a seat on the least loaded usable host; None when none has room."""
        ...

    def release(self, host: str) -> None: ...

    async def run(self, attempt: Attempt) -> Any: ...

    def capacity_snapshot(self) -> dict[str, dict[str, dict[str, float]]]: ...

    async def close(self) -> None: ...


class LocalEngine:
    """Runs attempts as asyncio tasks of this process; hosts are labels over local execution slots."""

    name = "local"

    def __init__(self) -> None:
        self._runner: Runner[Any] | None = None
        self._env: EngineEnv | None = None
        self._capacity: SharedCapacity | None = None
        self._hosts: dict[str, int] = {}
        self._seated: dict[str, int] = {}

    async def start(self, runner: Runner[Any], env: EngineEnv) -> None:
        cfg = env.config
        slots = cfg.capacity.execution_slots or os.cpu_count() or 1
        self._hosts = dict(cfg.local_hosts) if cfg.local_hosts else {"local": slots}
        self._seated = dict.fromkeys(self._hosts, 0)
        self._runner, self._env = runner, env
        self._capacity = SharedCapacity(
            inference_limit=cfg.capacity.inference_limit, execution_slots=self._hosts, clock=env.clock,
            observer=env.observer, inference_timeout_s=cfg.timeouts.inference_s, endpoint_open=env.endpoint_open)

    def hosts(self) -> Mapping[str, int]:
        return self._hosts

    def place(self, usable: Callable[[str], bool]) -> str | None:
        best, best_load = None, float("inf")
        for host, slots in self._hosts.items():
            load = self._seated[host] / slots
            if load < best_load and usable(host):
                best, best_load = host, load
        if best is not None:
            self._seated[best] += 1
        return best

    def release(self, host: str) -> None:
        self._seated[host] -= 1

    async def run(self, attempt: Attempt) -> Any:
        assert self._runner is not None and self._env is not None and self._capacity is not None, "engine not started"
        env = self._env
        ctx: EpisodeContext | None = None

        def on_running() -> None:
            if ctx is not None:
                ctx.stage(EpisodeState.RUNNING)

        episode_s = attempt.timeouts.episode_s
        ctx = EpisodeContext(attempt.request, attempt.number, attempt.host,
                             self._capacity.bind(attempt.host, on_running), attempt.timeouts,
                             None if episode_s is None else env.clock() + episode_s, attempt.on_stage, env.clock,
                             attempt.cancel_requested)
        return await self._runner(attempt.request, ctx)

    def capacity_snapshot(self) -> dict[str, dict[str, dict[str, float]]]:
        return self._capacity.snapshot() if self._capacity else {"inference": {}, "execution": {}}

    async def close(self) -> None:
        pass


def make_engine(config: SchedulerConfig) -> Engine:
    if config.engine == "ray":
        from tryloop.scheduler.ray_engine import RayEngine

        return RayEngine()
    return LocalEngine()
