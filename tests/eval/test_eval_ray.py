"""Real episodes on a real local multi-node Ray cluster: the same evaluation, the same results."""

from __future__ import annotations

import pytest

from ray_cluster import local_cluster
from tryloop.agent.config import EpisodeLimits, PolicyConfig
from tryloop.agent.environments import Environments
from tryloop.config import TryloopConfig
from tryloop.eval.config import EvalConfig
from tryloop.eval.remote import RemoteEpisodes
from tryloop.eval.run import evaluate
from tryloop.eval.scheduled import ScheduledRunner
from tryloop.scheduler import AdmissionConfig, RayConfig, SchedulerConfig
from tryloop.tasks.store import TaskStore

pytestmark = pytest.mark.ray


async def test_oracle_evaluation_runs_on_ray_workers(runtime, runtime_config, reward_tasks, tmp_path):
    store = TaskStore(tmp_path / "tasks")
    for t in reward_tasks[:2]:
        store.add(t)
    cfg = TryloopConfig.model_validate({"runtime": runtime_config.model_dump(),
                                        "tasks": {"store_url": str(tmp_path / "tasks")}})
    with local_cluster(2):
        sched = SchedulerConfig(engine="ray", ray=RayConfig(host_resource="sandbox_host", episodes_per_host=2),
                                admission=AdmissionConfig(adaptive=False, initial=4, max=4))
        remote = RemoteEpisodes(cfg, PolicyConfig(name="oracle"), EpisodeLimits())
        runner = ScheduledRunner(sched, remote=remote)
        tasks = [store.get(t.fingerprint()) for t in reward_tasks[:2]]
        envs = Environments(runtime)   # unused by remote episodes; evaluate's signature wants one
        res = await evaluate(tasks, None, envs, cfg=EvalConfig(k=2), run_id="ray", runner=runner)
        await runner.aclose()
        await envs.close()
    assert len(res.trajectories) == 4 and not runner.failed
    assert all(t.verdict == "pass" and t.policy == "oracle" for t in res.trajectories)
    assert res.summary.pass_at_1.value == 1.0 and runner.summary["engine"] == "ray"
