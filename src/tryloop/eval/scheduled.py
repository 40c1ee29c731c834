"""Episodes through the scheduler: the `EpisodeRunner` that `tryloop eval` and `tryloop train` use.

Each episode becomes a scheduler request; the scheduler retries infrastructure
faults with backoff, quarantines tasks that keep failing for infrastructure
reasons, enforces the episode timeout, holds inference permits and execution
slots (the episode asks for them around generation and tool runs) and keeps
metrics. Episodes that end failed are not yielded: they are in `failed` with
their typed failure, and `summary` holds the scheduler's figures for reports.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry

from tryloop.agent.episode import EpisodeHooks
from tryloop.errors import ConfigError
from tryloop.eval.remote import WorkerEpisodes, payload
from tryloop.eval.runner import EpisodeFn
from tryloop.scheduler.config import SchedulerConfig
from tryloop.scheduler.core import Scheduler
from tryloop.scheduler.request import EpisodeOutcome, EpisodeRequest, EpisodeState

_STAGES = {"running": EpisodeState.RUNNING, "verifying": EpisodeState.VERIFYING}


def hooks(ctx) -> EpisodeHooks:
    """An episode's hooks from a scheduler context: its capacity, its progress, and its turn and
    verification timeouts (`timeouts.turn_s`, `timeouts.verification_s`)."""
    return EpisodeHooks(capacity=ctx.capacity, stage=lambda name: ctx.stage(_STAGES[name]),
                        turn=ctx.turn, verification=ctx.verification)


def bounded(config: SchedulerConfig, concurrency: int) -> SchedulerConfig:
    """`config` with episode concurrency capped at `concurrency` (admission may adapt below it)."""
    adm = config.admission
    return config.model_copy(update={"admission": adm.model_copy(update={
        "initial": min(adm.initial, concurrency), "max": concurrency, "min": min(adm.min, concurrency)})})


class ScheduledRunner:
    """One scheduler for the runner's lifetime (its metrics live in one registry); each `run`
    submits a batch and yields its results. `aclose()` when done."""

    def __init__(self, config: SchedulerConfig | None = None, *, registry: CollectorRegistry | None = None,
                 remote: WorkerEpisodes | None = None):
        """`remote`: run episodes with this picklable runner (on Ray workers) instead of the
        `fn` given to `run` (a closure over this process's sandboxes and model)."""
        self.config = config or SchedulerConfig()
        if self.config.engine != "local" and remote is None:
            raise ConfigError("scheduler.engine: ray needs episodes a worker can rebuild (tryloop.eval.remote."
                              "RemoteEpisodes); this command's episodes share one in-process model")
        self.remote = remote
        self.registry = registry if registry is not None else CollectorRegistry()
        self.failed: list[EpisodeOutcome] = []        # of the latest run (set as it ends)
        # Merged into each request's payload as `meta` (what a remote runner needs besides the
        # episode, e.g. the weights version announced for it); read when `run` submits.
        self.payload_meta: dict[str, Any] = {}
        self.summary: dict[str, Any] = {}
        self._fns: dict[str, tuple[Any, EpisodeFn]] = {}
        self._sched: Scheduler | None = None

    async def _runner(self, sreq: EpisodeRequest, ctx) -> Any:
        req, fn = self._fns[sreq.id]
        return await fn(req, hooks(ctx))

    async def run(self, requests: Sequence[Any], fn: EpisodeFn) -> AsyncIterator[Any]:
        if self._sched is None:
            self._sched = Scheduler(self.remote or self._runner, self.config, registry=self.registry)
            await self._sched.start()
        sched = self._sched
        failed: list[EpisodeOutcome] = []
        self.failed = failed
        ids = {r.episode_id for r in requests}
        self._fns.update({r.episode_id: (r, fn) for r in requests})
        try:
            meta = dict(self.payload_meta)
            await sched.submit_many([EpisodeRequest(r.episode_id, r.task.id, group=r.group_id,
                                                    sample_index=r.sample_index,
                                                    payload=payload(r) | ({"meta": {**meta, **r.meta}}
                                                                          if r.meta or meta else {}))
                                     for r in requests])
            seen: set[str] = set()
            async for outcome in sched.results():
                if outcome.id not in ids:
                    continue
                seen.add(outcome.id)
                if outcome.ok:
                    yield outcome.result
                else:
                    failed.append(outcome)
            await sched.drain()
            for outcome in sched.outcomes():  # any that ended before the subscription began
                if outcome.id in ids and outcome.id not in seen:
                    if outcome.ok:
                        yield outcome.result
                    else:
                        failed.append(outcome)
            self.summary = sched.summary()
            self.failed = failed   # concurrent runs (overlapped rollouts) each leave their own
        finally:
            for i in ids:
                self._fns.pop(i, None)
                if sched.outcome(i) is not None:
                    sched.forget(i)   # results live in the trajectory store, not in memory

    async def aclose(self) -> None:
        if self._sched is not None:
            await self._sched.close()
            self._sched = None
