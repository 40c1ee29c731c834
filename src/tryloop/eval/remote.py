"""Episodes a Ray worker can run: the runner carries configuration only, and builds the sandbox
runtime, the policy and the task store on the worker the first time it is called.

    ScheduledRunner(config with engine="ray", remote=RemoteEpisodes(cfg, policy, limits))

Each scheduler request carries what identifies its episode (task fingerprint,
sample, seed, run, step, group) in its payload; the worker loads the task from
the task store URL (shared storage: a local path on one machine, S3 and the
like on many), runs it with its own sandboxes, and returns the trajectory.
"""

from __future__ import annotations

from typing import Any

from tryloop.agent.config import EpisodeLimits, PolicyConfig
from tryloop.config import TryloopConfig


def payload(req: Any) -> dict[str, Any]:
    """What a worker needs to rebuild an `agent.episode.EpisodeRequest` (JSON-able: journaled)."""
    return {"task": req.task.fingerprint(), "sample": req.sample_index, "run": req.run_id, "step": req.step,
            "seed": req.seed, "group": req.group_id}


class WorkerEpisodes:
    """Base of the runners a Ray worker calls: pickles as configuration only, builds what
    `_build` returns (sandbox environments, a policy, a task store, a task cache) on its first
    call, and turns a scheduler request back into an `EpisodeRequest`."""

    _live: dict[str, Any] | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Only configuration travels; sandboxes, engines and clients are per worker.
        return {**self.__dict__, "_live": None}

    async def _build(self) -> dict[str, Any]:
        """{"envs", "policy", "store", "tasks": {}} and whatever else the runner needs, on the worker."""
        raise NotImplementedError

    async def _episode(self, sreq: Any) -> tuple[dict[str, Any], Any]:
        """(the worker's live objects, the request's `EpisodeRequest`) with its task loaded once per worker."""
        from tryloop.agent.episode import EpisodeRequest

        if self._live is None:
            self._live = await self._build()
        live, p = self._live, sreq.payload
        task = live["tasks"].get(p["task"])
        if task is None:
            task = live["tasks"][p["task"]] = live["store"].get(p["task"])
        return live, EpisodeRequest(sreq.id, task, sample_index=p["sample"], run_id=p["run"], step=p["step"],
                                    seed=p["seed"], group_id=p["group"])


class RemoteEpisodes(WorkerEpisodes):
    def __init__(self, cfg: TryloopConfig, policy: PolicyConfig, limits: EpisodeLimits):
        self.cfg, self.policy, self.limits = cfg, policy, limits
        self._live = None

    async def _build(self) -> dict[str, Any]:
        from tryloop.agent.environments import Environments
        from tryloop.agent.policies import make_policy
        from tryloop.sandbox import SandboxRuntime
        from tryloop.tasks.store import TaskStore

        runtime = SandboxRuntime(self.cfg.runtime)
        return {"envs": Environments(runtime), "policy": make_policy(self.policy, self.limits),
                "store": TaskStore(self.cfg.tasks.store_url), "tasks": {}}

    async def __call__(self, sreq: Any, ctx: Any) -> Any:
        from tryloop.agent.episode import run_episode
        from tryloop.eval.scheduled import hooks

        live, req = await self._episode(sreq)
        return await run_episode(req, live["policy"], live["envs"], limits=self.limits, spec=self.cfg.rewards.spec,
                                 hooks=hooks(ctx))
