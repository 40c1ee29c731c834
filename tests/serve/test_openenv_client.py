"""OpenEnv's own client (the `openenv-core` package) drives a served tryloop task through a whole episode."""

from __future__ import annotations

import pytest
from openenv.core.generic_client import GenericEnvClient

from host import CGROUP_PARENT
from tryloop.config import TryloopConfig
from tryloop.serve.server import serve_in_thread, served_tasks
from tryloop.tasks.sources.functions import function_tasks
from tryloop.tasks.store import TaskStore


@pytest.fixture
def served(tmp_path):
    store = TaskStore(tmp_path / "tasks")
    for t in function_tasks(tmp_path / "src", per_family=1, families=["affine"]):
        store.add(t)
    cfg = TryloopConfig.model_validate({
        "tasks": {"store_url": str(tmp_path / "tasks")},
        "store": {"trajectories_url": str(tmp_path / "trajectories")},
        "runtime": {"store_dir": str(tmp_path / "rt"), "state_dir": str(tmp_path / "state"),
                    "cgroup_name": CGROUP_PARENT},
        "serve": {"env": {"port": 0, "access_log": None}}})   # OpenEnv's client sends no token
    tasks = served_tasks(cfg)
    with serve_in_thread(cfg, tasks) as url:
        yield url, tasks[0]


def test_openenv_generic_client_plays_an_episode(served):
    url, task = served
    with GenericEnvClient(base_url=url).sync() as env:
        r = env.reset(task_id=task.id)
        assert not r.done and r.observation["instruction"] == task.instruction
        r = env.step({"tool_calls": [{"name": "view", "arguments": {"path": task.meta.answer_file}}]})
        assert not r.done and r.observation["results"][0]["ok"]
        reference = task.solution_files()[task.meta.answer_file].decode()
        r = env.step({"text": f"Here is the fix:\n```python\n{reference}```\n"})   # the answer-file shortcut
        assert r.done and r.reward > 0.9
        assert r.observation["verdict"]["state"] == "pass"
        state = env.state()
        assert state["step_count"] == 2 and state["done"] and state["episode_id"]
