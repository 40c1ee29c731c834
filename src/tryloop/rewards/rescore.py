"""Re-score stored trajectories under another reward version (their diffs are kept for this)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from tryloop.agent.trajectory import Trajectory
from tryloop.rewards.spec import RewardSpec
from tryloop.rewards.submission import Submission
from tryloop.rewards.verdict import Verdict
from tryloop.rewards.verifier import decode_changes, verify
from tryloop.sandbox import SandboxRuntime
from tryloop.tasks.model import Task


@dataclass
class Rescored:
    episode_id: str
    task_id: str
    old_state: str | None
    old_reward: float | None
    old_version: str
    new: Verdict

    @property
    def moved(self) -> bool:
        return self.old_state != self.new.state or self.old_reward != self.new.reward


def submission_of(t: Trajectory) -> Submission:
    commands = [str(c.arguments.get("command", "")) for turn in t.turns for c in turn.tool_calls
                if c.name == "shell"]
    reads = [str(c.arguments.get("path", "")) for turn in t.turns for c in turn.tool_calls if c.name == "view"]
    return Submission(changes=decode_changes(t.changes), commands=commands, reads=reads,
                      metrics={"turns": len(t.turns), "tokens": t.completion_tokens,
                               "wall_s": t.times.get("episode", 0.0),
                               "tool_errors": sum(1 for turn in t.turns for o in turn.observations
                                                  if not o.ok and o.name not in ("parse", "none"))},
                      answer=t.turns[-1].text if t.turns else "")


async def rescore(runtime: SandboxRuntime, tasks: dict[str, Task], trajectories: list[Trajectory],
                  spec: RewardSpec, *, concurrency: int = 2,
                  on_result: Callable[[Rescored], None] | None = None) -> list[Rescored]:
    """Verdicts under `spec` for every trajectory whose task (by fingerprint) is in `tasks`."""
    sem = asyncio.Semaphore(concurrency)

    async def one(t: Trajectory) -> Rescored | None:
        task = tasks.get(t.task_fingerprint)
        if task is None:
            return None
        async with sem:
            v = await verify(runtime, task, submission_of(t), spec)
        r = Rescored(t.episode_id, t.task_id, t.verdict, t.reward, t.reward_version, v)
        if on_result:
            on_result(r)
        return r

    return [r for r in await asyncio.gather(*(one(t) for t in trajectories)) if r is not None]
