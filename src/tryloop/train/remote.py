"""Training episodes a Ray rollout worker can run (`scheduler.engine: ray`).

    ScheduledRunner(config with engine="ray", remote=RemoteTrainEpisodes(cfg, tcfg, endpoints, ...))

Like `tryloop.eval.remote.RemoteEpisodes`, only configuration travels: the worker
builds its sandbox runtime, warm pools and task-store client on its node the first
time it is called. Its policy samples from the trainer's sampler endpoints (the
learner's own `serve model` server, or `train.sampler.endpoints`) through an
`EndpointSampler`, so its sessions are token-exact exactly as on the local engine
and the trajectory that comes back is the one the learner trains on.

Weights: each request's payload says which weights version the trainer announced
for it (`meta.weights`) and which endpoints its last push reached (`meta.endpoints`);
a completion sampled with any other version is asked of another endpoint, and only
when none is left does the episode fail with a `SamplerError`, which the trainer
turns into a stop. With no
announced version (overlapped rollouts, where a push may land mid-episode) the
worker records the versions and the trainer checks every one against the
versions it pushed.

A worker whose tryloop differs from the trainer's (`tryloop.__version__` or the
hash of the package's source) refuses every episode with a
`WorkerVersionMismatch`, which the trainer also turns into a stop.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tryloop.config import TryloopConfig
from tryloop.errors import TryloopError
from tryloop.eval.remote import WorkerEpisodes


class WorkerVersionMismatch(TryloopError):
    """A rollout worker runs another tryloop than the trainer."""

    failure_kind = "policy"
    retryable = False
    fatal = True    # its episode's failure carries the flag back through Ray, and the trainer stops


class _Fatal(TryloopError):
    """A sampler failure on a worker, carried back as a terminal episode failure."""

    failure_kind = "policy"
    retryable = False
    fatal = True


@functools.cache
def code_hash() -> str:
    """sha256 (16 hex) of tryloop's own Python source: two processes with the same hash run the same code."""
    from tryloop.rewards.version import source_hash

    root = Path(__file__).resolve().parents[1]
    return source_hash((p for p in sorted(root.rglob("*.py")) if p.relative_to(root).parts[0] != "assets"), root=root)


def code_identity() -> dict[str, str]:
    import tryloop

    return {"version": tryloop.__version__, "code": code_hash()}


class _Pinned:
    """The worker's shared `EndpointSampler` for one episode: only `accept` (None: any version), only
    from `among` (the endpoints the trainer's last push reached; None: any)."""

    def __init__(self, sampler: Any, accept: str | None, label: str | None = None,
                 among: list[str] | None = None):
        self.sampler, self.accept, self.label, self.among = sampler, accept, label, among
        self.failure: Exception | None = None
        self.max_context = sampler.max_context

    @property
    def weights_version(self) -> str:
        return self.accept or self.label or self.sampler.announced

    async def generate(self, prompt_ids: list[int], **kw: Any) -> Any:
        from tryloop.agent.endpoints import SamplerError

        try:
            # An endpoint that answers with other weights is set aside and another one asked.
            return await self.sampler.generate(prompt_ids, accept=self.accept, among=self.among, **kw)
        except SamplerError as e:
            self.failure = e
            raise


class RemoteTrainEpisodes(WorkerEpisodes):
    def __init__(self, cfg: TryloopConfig, tcfg: Any, endpoints: list[str], *, kind: str = "tryloop",
                 api_key: str | None = None):
        self.cfg, self.tcfg, self.endpoints, self.kind, self.api_key = cfg, tcfg, endpoints, kind, api_key
        self.identity = code_identity()      # the trainer's; each worker compares its own
        self._live = None

    async def _build(self) -> dict[str, Any]:
        from transformers import AutoTokenizer

        from tryloop.agent.environments import Environments
        from tryloop.agent.hf import resolve_model
        from tryloop.sandbox import SandboxRuntime
        from tryloop.tasks.store import TaskStore
        from tryloop.train.zone import endpoint_sampler, sampler_policy

        mine = code_identity()
        if mine != self.identity:
            raise WorkerVersionMismatch(f"this rollout worker runs tryloop {mine['version']} (code {mine['code']}) "
                                        f"but the trainer runs {self.identity['version']} (code "
                                        f"{self.identity['code']}): install the same tryloop on every node")
        tc = self.tcfg
        name = tc.policy.name
        # Sampling happens on the endpoints: the worker needs only the tokenizer (the chat template).
        path = resolve_model(name)[0]
        tokenizer = AutoTokenizer.from_pretrained(str(path or name), local_files_only=path is not None)
        sampler = endpoint_sampler(tc, endpoints=self.endpoints, kind=self.kind, api_key=self.api_key,
                                   check_versions=False)
        # Mid-run a worker may start while an endpoint is lost: that one is set aside, not fatal.
        await sampler.connect("", check_version=False, all_up=False)
        loaded = SimpleNamespace(tokenizer=tokenizer, name=name, weights_version="")
        return {"envs": Environments(SandboxRuntime(self.cfg.runtime)), "sampler": sampler,
                "policy": sampler_policy(loaded, tc, engine=sampler), "store": TaskStore(self.cfg.tasks.store_url),
                "tasks": {}}

    async def __call__(self, sreq: Any, ctx: Any) -> Any:
        from tryloop.agent.episode import run_episode
        from tryloop.eval.scheduled import hooks

        live, req = await self._episode(sreq)
        meta = sreq.payload.get("meta") or {}
        pinned = _Pinned(live["sampler"], meta.get("weights"), meta.get("version"), meta.get("endpoints"))
        policy = copy.copy(live["policy"])
        policy.engine = pinned
        temperature = meta.get("temperature")
        if temperature is not None:       # an evaluation's own temperature
            policy.temperature = temperature
        traj = await run_episode(req, policy, live["envs"], limits=self.tcfg.limits, spec=self.cfg.rewards.spec,
                                 hooks=hooks(ctx))
        if pinned.failure is not None:    # the episode's tokens are not the announced policy's: never trained on
            raise _Fatal(f"SamplerError: {pinned.failure}")
        return traj
