"""What the framework integrations' tests share: two function-level tasks in a store, and a
config naming that store and a sandbox runtime of their own."""

from __future__ import annotations

import json
from pathlib import Path

from host import CGROUP_PARENT
from tryloop.tasks.model import Task
from tryloop.tasks.sources.functions import function_tasks
from tryloop.tasks.store import TaskStore


def function_task_store(root: Path) -> tuple[list[Task], TaskStore, Path]:
    """The tasks, their store and the config file (under `root`)."""
    tasks = function_tasks(root / "src", per_family=1, families=["affine", "add-suffix"])
    store = TaskStore(root / "tasks")
    for t in tasks:
        store.add(t)
    cfg = root / "tryloop.yaml"
    cfg.write_text(json.dumps({   # JSON is YAML
        "tasks": {"store_url": str(root / "tasks")},
        "runtime": {"store_dir": str(root / "rt"), "state_dir": str(root / "state"), "cgroup_name": CGROUP_PARENT}}))
    return tasks, store, cfg
