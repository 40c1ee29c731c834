"""What the trainer integrations share: one process-wide judge that plays text from outside tryloop as
episodes in real sandboxes and has the verifier judge them.

`Judge` holds the process's task store, sandbox runtime and an event loop on a background thread;
`get_judge()` makes it on first use from the YAML file named by ``TRYLOOP_CONFIG`` (or the
defaults), `close()` releases its sandboxes. `Judge.judge` plays a reply as the one turn of an
episode (verl's reward function, TRL's reward function); `Judge.judge_many` plays a batch of them
concurrently; `Judge.submit` runs any coroutine on the judge's loop (TRL's multi-turn environment
drives `run_episode` through it).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
from typing import Any

from tryloop.agent.chat import parse_tool_calls
from tryloop.agent.config import EpisodeLimits
from tryloop.agent.policy import Action, TokenLog
from tryloop.agent.profiles import profile_for
from tryloop.agent.trajectory import Observation, Trajectory
from tryloop.config import TryloopConfig, load_yaml
from tryloop.errors import TryloopError

__all__ = ["Judge", "close", "get_judge", "verdict_of"]


class Reply:
    """A policy whose one action is a given text, parsed as a model's reply would be."""

    name = "external-response"
    version = "external"

    def __init__(self, text: str):
        self.text = text

    def session(self, system: str, instruction: str, *, seed: int = 0, task=None) -> _ReplySession:
        # The task's own tool set, as the model policies parse it (agent.profiles).
        return _ReplySession(system, instruction, self.text, list(profile_for(task).tools))


class _ReplySession:
    def __init__(self, system: str, instruction: str, text: str, tool_names: list[str]):
        self.tokens = TokenLog(source="unavailable")
        self.messages = [{"role": "system", "content": system}, {"role": "user", "content": instruction}]
        self.text = text
        self.tool_names = tool_names

    async def act(self, observations: list[Observation] | None) -> Action:
        parsed = parse_tool_calls(self.text, shell_tool="shell", known_tools=self.tool_names)
        self.messages.append({"role": "assistant", "content": self.text})
        return Action(self.text, parsed.calls)


def verdict_of(traj: Trajectory) -> dict[str, Any]:
    """The parts of a judged trajectory the integrations hand back."""
    return {"score": float(traj.reward or 0.0), "passed": float(traj.verdict == "pass"),
            "verdict": traj.verdict, "flags": list(traj.flags), "reward_version": traj.reward_version,
            "episode_id": traj.episode_id, "components": dict(traj.reward_components)}


class Judge:
    """The process's sandbox runtime, task store and event loop, made on first use."""

    def __init__(self, cfg: TryloopConfig):
        from tryloop.agent.environments import Environments
        from tryloop.sandbox import SandboxRuntime
        from tryloop.tasks.store import TaskStore

        self.cfg = cfg
        self.store = TaskStore(cfg.tasks.store_url)
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="tryloop-judge", daemon=True).start()
        # Built on the judge's loop: the runtime and pools belong to the loop they were made in.
        self.envs = self.call(_on_loop(lambda: Environments(SandboxRuntime(cfg.runtime))))
        self.ids = itertools.count()
        self._tasks: dict[str, Any] = {}

    def submit(self, coro) -> Any:
        """Run `coro` on the judge's loop; a concurrent.futures.Future of its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call(self, coro) -> Any:
        return self.submit(coro).result()

    def task(self, fingerprint: str):
        """The task `fingerprint` names (cached: a task version never changes)."""
        task = self._tasks.get(fingerprint)
        if task is None:
            try:
                task = self.store.get(fingerprint)
            except (KeyError, TryloopError) as e:
                raise ValueError(f"{fingerprint!r} names no task in {self.cfg.tasks.store_url}: {e}") from e
            self._tasks[fingerprint] = task
        return task

    def episode_id(self, prefix: str) -> str:
        return f"{prefix}-{os.getpid()}-{next(self.ids)}"

    async def play(self, fingerprint: str, response: str, limits: EpisodeLimits, *, prefix: str = "external",
                   run_id: str = "external") -> Trajectory:
        """On the judge's loop: `response` as the one turn of an episode on the task, judged."""
        from tryloop.agent.episode import EpisodeRequest, run_episode

        req = EpisodeRequest(episode_id=self.episode_id(prefix), task=self.task(fingerprint), run_id=run_id)
        return await run_episode(req, Reply(response), self.envs, limits=limits, spec=self.cfg.rewards.spec)

    def judge(self, fingerprint: str, response: str, limits: EpisodeLimits, *, prefix: str = "external",
              run_id: str = "external") -> dict[str, Any]:
        self.task(fingerprint)   # an unknown task is the caller's error, raised here rather than on the loop
        return verdict_of(self.call(self.play(fingerprint, response, limits, prefix=prefix, run_id=run_id)))

    def judge_many(self, items: list[tuple[str, str]], limits: EpisodeLimits, *, prefix: str = "external",
                   run_id: str = "external") -> list[Trajectory]:
        """Each (fingerprint, response) played and judged, all at once; trajectories in order."""
        for fingerprint, _ in items:
            self.task(fingerprint)

        async def _all():
            return await asyncio.gather(*(self.play(fp, text, limits, prefix=prefix, run_id=run_id)
                                          for fp, text in items))
        return list(self.call(_all()))

    def close(self) -> None:
        """End the episodes still open (a multi-turn environment's), close every sandbox, stop the loop."""
        async def _close():
            pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            await self.envs.close()
            await self.envs.runtime.close_all()
        self.call(_close())
        self.loop.call_soon_threadsafe(self.loop.stop)


async def _on_loop(make: Any) -> Any:
    return make()


_judge: Judge | None = None
_lock = threading.Lock()


def close() -> None:
    """Release the process's sandboxes (a later call starts them again)."""
    global _judge
    with _lock:
        if _judge is not None:
            _judge.close()
            _judge = None


def get_judge() -> Judge:
    """The process's judge, configured from ``TRYLOOP_CONFIG`` (or the defaults) on first use."""
    global _judge
    with _lock:
        if _judge is None:
            path = os.environ.get("TRYLOOP_CONFIG")
            _judge = Judge(load_yaml(path) if path else TryloopConfig())
        return _judge
