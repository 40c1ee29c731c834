"""Scripted policies for tests and benchmarks: they act through the same tools as a model.

* `Oracle` — looks at the code, writes the reference solution with the write
  tool, runs the tests, submits: an episode that must pass.
* `DoNothing` — submits at once: must fail.
* `RandomPolicy` — seeded random calls, malformed ones included: the loop must survive it.
* `Hacker(attack)` — carries out a red-team attack (tryloop.rewards.redteam) through
  the tools: must end not passed and flagged.

They know no tokens: their trajectories say `token_source = "unavailable"`.
"""

from __future__ import annotations

import json
import random
import shlex
import time
from collections.abc import Iterator

from tryloop.agent.policy import Action, TokenLog
from tryloop.agent.trajectory import Observation, ToolCall
from tryloop.tasks.model import Task


def render(calls: list[ToolCall], thought: str = "") -> str:
    """The text a model would write for these calls (the format the system prompt teaches)."""
    parts = [thought] if thought else []
    parts += [f"<tool_call>{json.dumps({'name': c.name, 'arguments': c.arguments})}</tool_call>" for c in calls]
    return "\n".join(parts)


class _ScriptSession:
    def __init__(self, system: str, instruction: str, steps: Iterator[list[ToolCall]]):
        self.tokens = TokenLog(source="unavailable")
        self.messages = [{"role": "system", "content": system}, {"role": "user", "content": instruction}]
        self._steps = steps
        self._n = 0

    async def act(self, observations: list[Observation] | None) -> Action:
        t0 = time.perf_counter()
        for obs in observations or []:
            self.messages.append({"role": "tool", "name": obs.name, "content": obs.content})
        calls = next(self._steps, None) or [ToolCall("submit", {})]
        self._n += 1
        for i, c in enumerate(calls):
            c.id = c.id or f"call_{self._n}_{i}"
        text = render(calls)
        self.messages.append({"role": "assistant", "content": text})
        return Action(text, calls, model_s=time.perf_counter() - t0)


class _Scripted:
    version = "scripted"
    name = "scripted"

    def steps(self, task: Task | None, rng: random.Random) -> Iterator[list[ToolCall]]:
        raise NotImplementedError

    def session(self, system: str, instruction: str, *, seed: int = 0, task: Task | None = None) -> _ScriptSession:
        return _ScriptSession(system, instruction, self.steps(task, random.Random(seed)))


def _need(task: Task | None, who: str) -> Task:
    if task is None:
        raise ValueError(f"the {who} policy needs the task (session(..., task=task))")
    return task


class Oracle(_Scripted):
    name = "oracle"

    def steps(self, task, rng):
        task = _need(task, "oracle")
        solution = task.solution_files()
        first = next(iter(solution), None)
        if first:
            yield [ToolCall("view", {"path": first})]
        for path, data in solution.items():
            yield [ToolCall("write", {"path": path, "content": data.decode()})]
        # An answer-graded task has no tests to run in the workspace: check the answer parses instead.
        check = "python3 -m json.tool answer.json" if task.meta.grader == "answer" else task.meta.test_command
        yield [ToolCall("shell", {"command": check})]
        yield [ToolCall("submit", {})]


class DoNothing(_Scripted):
    name = "do-nothing"

    def steps(self, task, rng):
        yield [ToolCall("submit", {})]


class RandomPolicy(_Scripted):
    name = "random"

    def __init__(self, turns: int = 6):
        self.turns = turns

    def steps(self, task, rng):
        paths = sorted(task.workspace_files()) if task else ["README.md"]
        menu = [
            lambda: ToolCall("view", {"path": rng.choice(paths)}),
            lambda: ToolCall("view", {"path": rng.choice(paths), "start": rng.randint(1, 30), "end": rng.randint(1, 60)}),
            lambda: ToolCall("shell", {"command": rng.choice(["ls -la", "python3 -m pytest -q -x", "cat nope"])}),
            lambda: ToolCall("search", {"pattern": rng.choice(["def ", "class ", "return"])}),
            lambda: ToolCall("replace", {"path": rng.choice(paths), "old": "zzz-not-there", "new": "x"}),
            lambda: ToolCall("view", {}),                              # malformed: missing path
            lambda: ToolCall("teleport", {"where": "home"}),           # unknown tool
            lambda: ToolCall("shell", {"command": 42}),                # wrong type
        ]
        for _ in range(self.turns):
            yield [rng.choice(menu)()]
        yield [ToolCall("submit", {})]


class Hacker(_Scripted):
    """Carries out one red-team attack through the tools."""

    def __init__(self, attack: str):
        if attack not in _attacks():
            raise ValueError(f"unknown attack {attack!r}; known: {sorted(_attacks())}")
        self.attack = attack
        self.name = f"hacker:{attack}"

    def steps(self, task, rng):
        sub = _attacks()[self.attack](_need(task, "hacker"))
        for cmd in sub.commands:
            yield [ToolCall("shell", {"command": cmd})]
        for path, data in sub.changes.items():
            if data is None:
                yield [ToolCall("shell", {"command": f"rm -f -- {shlex.quote(path)}"})]
            else:
                yield [ToolCall("write", {"path": path, "content": data.decode(errors="replace")})]
        yield [ToolCall("submit", {})]


def _attacks() -> dict:
    """The code red team's attacks and those on answer-graded tasks."""
    from tryloop.rewards.answer_redteam import ANSWER_ATTACKS
    from tryloop.rewards.redteam import ATTACKS

    return {**ATTACKS, **ANSWER_ATTACKS}
