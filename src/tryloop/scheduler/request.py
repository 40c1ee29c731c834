"""An episode request, its state machine, and what can be read about it while and after it runs.

    queued ──► provisioning ──► running ──► verifying ──► done
      ▲  │          │              │            │
      │  └──────────┴──────────────┴────────────┴──► failed | cancelled
      └──── retry (after backoff) ◄─┘ (from any active state)

`provisioning` starts when an attempt is placed on a host; the runner moves the
episode to `running` (first turn or inference request) and to `verifying`
(`ctx.verification()`). Every transition is stamped with the scheduler's clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Generic, TypeVar

from tryloop.scheduler.failures import FailureInfo

R = TypeVar("R")


class EpisodeState(StrEnum):
    QUEUED = "queued"
    PROVISIONING = "provisioning"
    RUNNING = "running"
    VERIFYING = "verifying"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL

    @property
    def active(self) -> bool:
        return self in _ACTIVE


_TERMINAL = frozenset({EpisodeState.DONE, EpisodeState.FAILED, EpisodeState.CANCELLED})
_ACTIVE = frozenset({EpisodeState.PROVISIONING, EpisodeState.RUNNING, EpisodeState.VERIFYING})

# Allowed moves. Active -> queued is a retry; queued -> failed is a quarantined task.
TRANSITIONS: dict[EpisodeState, frozenset[EpisodeState]] = {
    EpisodeState.QUEUED: frozenset({EpisodeState.PROVISIONING, EpisodeState.FAILED, EpisodeState.CANCELLED}),
    EpisodeState.PROVISIONING: frozenset({EpisodeState.RUNNING, EpisodeState.VERIFYING, *_TERMINAL, EpisodeState.QUEUED}),
    EpisodeState.RUNNING: frozenset({EpisodeState.VERIFYING, *_TERMINAL, EpisodeState.QUEUED}),
    EpisodeState.VERIFYING: frozenset({EpisodeState.RUNNING, *_TERMINAL, EpisodeState.QUEUED}),
    EpisodeState.DONE: frozenset(),
    EpisodeState.FAILED: frozenset(),
    EpisodeState.CANCELLED: frozenset(),
}


@dataclass(frozen=True)
class EpisodeRequest:
    """One episode to run: which task, which sample of which group, how urgent, served by which endpoint.

    `id` is the dedup key: submitting an id the scheduler already knows (also from its
    journal) runs nothing new. `payload` is opaque to the scheduler and must be JSON-able
    (it is journaled); `priority`: higher runs first, and can be changed while queued.
    """

    id: str
    task_id: str
    group: str = ""
    sample_index: int = 0
    priority: float = 0.0
    endpoint: str = "default"
    payload: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "task_id": self.task_id, "group": self.group, "sample_index": self.sample_index,
                "priority": self.priority, "endpoint": self.endpoint, "payload": dict(self.payload)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> EpisodeRequest:
        return cls(**d)


@dataclass(frozen=True)
class Transition:
    state: EpisodeState
    at: float            # scheduler clock (loop time: monotonic, or virtual in simulation)
    attempt: int


@dataclass(frozen=True)
class EpisodeStatus:
    """A snapshot of one episode, safe to hand out while it runs."""

    id: str
    task_id: str
    state: EpisodeState
    priority: float
    attempt: int                              # attempts started so far
    host: str | None                          # where the current / last attempt ran
    transitions: tuple[Transition, ...]
    failure: FailureInfo | None               # the final failure, or the last one that was retried
    retries: Mapping[str, int]                # retries so far, by failure kind

    def entered(self, state: EpisodeState) -> float | None:
        """When the episode last entered `state` (None: never)."""
        for t in reversed(self.transitions):
            if t.state is state:
                return t.at
        return None


@dataclass(frozen=True)
class EpisodeOutcome(Generic[R]):
    """How an episode ended: done with a result, failed with its typed failure, or cancelled."""

    id: str
    task_id: str
    state: EpisodeState
    result: R | None
    failure: FailureInfo | None
    attempts: int
    stage_seconds: Mapping[str, float]       # time spent per state, over all attempts

    @property
    def ok(self) -> bool:
        return self.state is EpisodeState.DONE
