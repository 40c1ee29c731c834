"""The policy contract: a session per episode that turns observations into actions.

    session = policy.session(system_prompt, instruction, seed=...)
    action = await session.act(None)            # first turn
    action = await session.act(observations)    # the answers to the previous action's calls

A session owns the episode's token log: prompt and observation tokens are
appended unmasked, sampled tokens masked in with their log-probabilities, in the
exact order the model saw them (docs/architecture.md, invariant 6). A policy that cannot
know its tokens (a server without token data, a scripted policy) says so with
`tokens.source = "unavailable"`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from tryloop.agent.trajectory import Observation, TokenSource, ToolCall
from tryloop.errors import TryloopError
from tryloop.tasks.model import Task


class ContextFull(TryloopError):
    """The next turn would not fit the model's context (or the episode's token budget)."""


class PolicyError(TryloopError):
    """The policy could not produce an action. A `retryable` one (the inference service is down or
    overloaded: 5xx, timeouts) is raised out of the episode for the scheduler to retry with backoff
    and count against the endpoint's breaker; any other ends the episode with termination "error"."""

    failure_kind = "policy"

    def __init__(self, message: str, *, retryable: bool = False):
        super().__init__(message)
        self.retryable = retryable


@dataclass
class Action:
    text: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    parse_error: str | None = None       # the text held something call-like that did not parse
    finish_reason: str = "stop"          # stop | length
    completion_tokens: int = 0
    model_s: float = 0.0
    weights_versions: tuple[str, ...] = ()   # the weights that sampled the turn's tokens, in order


@dataclass
class TokenLog:
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    prompt_length: int = 0
    source: TokenSource = "exact"

    def add_context(self, ids: list[int]) -> None:
        self.ids += ids
        self.logprobs += [0.0] * len(ids)
        self.mask += [0] * len(ids)

    def add_sampled(self, ids: list[int], logprobs: list[float]) -> None:
        if len(ids) != len(logprobs):
            raise ValueError(f"{len(ids)} sampled ids but {len(logprobs)} logprobs")
        if not self.prompt_length and not any(self.mask):
            self.prompt_length = len(self.ids)
        self.ids += ids
        self.logprobs += logprobs
        self.mask += [1] * len(ids)


class PolicySession(Protocol):
    tokens: TokenLog
    messages: list[dict[str, Any]]

    async def act(self, observations: list[Observation] | None) -> Action: ...


class Policy(Protocol):
    name: str
    version: str        # weights version: trajectories record what sampled them

    def session(self, system: str, instruction: str, *, seed: int = 0, task: Task | None = None) -> PolicySession:
        """`task` is for scripted policies (the oracle knows the reference); models ignore it."""
        ...


@contextlib.contextmanager
def sampling_temperature(policy: Any, temperature: float) -> Iterator[None]:
    """Sample at `temperature` inside the block and restore the policy's own afterwards, also on
    error; a policy without a temperature (scripted) is left alone."""
    if not hasattr(policy, "temperature"):
        yield
        return
    saved = policy.temperature
    policy.temperature = temperature
    try:
        yield
    finally:
        policy.temperature = saved
