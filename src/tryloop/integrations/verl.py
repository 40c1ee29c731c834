"""verl's custom reward function: a response to a row of `export_verl`'s dataset, judged by the verifier.

In verl's configuration::

    custom_reward_function:
      path: <the path of this file>   # python -c "import tryloop.integrations.verl as m; print(m.__file__)"
      name: compute_score

verl calls ``compute_score(data_source, solution_str, ground_truth, extra_info)`` for every
response. `ground_truth` is the task's fingerprint (what `export_verl` writes in
`reward_model.ground_truth`); the task is looked up in the task store, so the hidden tests never
travel with the dataset. The response is played as the one turn of a tryloop episode in a real
sandbox of the task: a reply with code for a function-level task is written to its answer file,
tool calls in the reply are run, then the episode submits and the verifier judges it, exactly as in
`tryloop eval` with one turn. The returned dict's `score` is the episode's reward; `passed` and the
number of `flags` ride along (verl logs a dict's other keys as metrics).

Configuration: the YAML file named by ``TRYLOOP_CONFIG`` (or the defaults): `tasks.store_url` says
where the tasks are, `runtime` where sandboxes live, `rewards.spec` how the reward is made. One
sandbox runtime and one event loop (a background thread) serve every call of the process; calls
from several threads are judged concurrently.
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
from tryloop.agent.trajectory import Observation
from tryloop.config import TryloopConfig, load_yaml
from tryloop.errors import TryloopError

__all__ = ["close", "compute_score", "judge_response"]


class _Reply:
    """A policy whose one action is a given text, parsed as a model's reply would be."""

    name = "verl-response"
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


class _Judge:
    """The process's sandbox runtime, task store and event loop, made on first use."""

    def __init__(self, cfg: TryloopConfig):
        from tryloop.agent.environments import Environments
        from tryloop.sandbox import SandboxRuntime
        from tryloop.tasks.store import TaskStore

        self.cfg = cfg
        self.store = TaskStore(cfg.tasks.store_url)
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="tryloop-verl-judge", daemon=True).start()
        # Built on the judge's loop: the runtime and pools belong to the loop they were made in.
        self.envs = self.call(_on_loop(lambda: Environments(SandboxRuntime(cfg.runtime))))
        self.ids = itertools.count()

    def call(self, coro) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def judge(self, fingerprint: str, response: str, limits: EpisodeLimits) -> dict[str, Any]:
        from tryloop.agent.episode import EpisodeRequest, run_episode

        try:
            task = self.store.get(fingerprint)
        except (KeyError, TryloopError) as e:
            raise ValueError(f"ground_truth {fingerprint!r} names no task in {self.cfg.tasks.store_url}: {e}") from e
        req = EpisodeRequest(episode_id=f"verl-{os.getpid()}-{next(self.ids)}", task=task, run_id="verl")
        traj = self.call(run_episode(req, _Reply(response), self.envs, limits=limits, spec=self.cfg.rewards.spec))
        return {"score": float(traj.reward or 0.0), "passed": float(traj.verdict == "pass"),
                "verdict": traj.verdict, "flags": list(traj.flags), "reward_version": traj.reward_version,
                "episode_id": traj.episode_id}


    def close(self) -> None:
        """Close every sandbox and stop the loop."""
        async def _close():
            await self.envs.close()
            await self.envs.runtime.close_all()
        self.call(_close())
        self.loop.call_soon_threadsafe(self.loop.stop)


async def _on_loop(make: Any) -> Any:
    return make()


_judge: _Judge | None = None
_lock = threading.Lock()


def close() -> None:
    """Release the process's sandboxes (a later call starts them again)."""
    global _judge
    with _lock:
        if _judge is not None:
            _judge.close()
            _judge = None


def _get_judge() -> _Judge:
    global _judge
    with _lock:
        if _judge is None:
            path = os.environ.get("TRYLOOP_CONFIG")
            _judge = _Judge(load_yaml(path) if path else TryloopConfig())
        return _judge


def judge_response(fingerprint: str, response: str, *, limits: EpisodeLimits | None = None) -> dict[str, Any]:
    """The verdict of `response` as the one turn of an episode on the task `fingerprint`."""
    limits = limits or EpisodeLimits(max_turns=1)
    return _get_judge().judge(fingerprint, response, limits)


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None,
                  **_: Any) -> dict[str, Any]:
    """verl's reward-function signature; see the module docstring. Only numbers come back (verl
    averages a dict's other keys as metrics): `score`, `passed` and the number of `flags`."""
    v = judge_response(str(ground_truth), solution_str)
    return {"score": v["score"], "passed": v["passed"], "flags": float(len(v["flags"]))}
