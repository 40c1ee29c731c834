"""`tryloop train` builds its default suite task by task: a build that is killed resumes where it
stopped on the next run, instead of training on the part it had stored. Real gating in sandboxes."""

from __future__ import annotations

import asyncio

import pytest
import yaml

import tryloop.cli.main  # noqa: F401  (registers the commands; importing cli.train first would cycle)
from host import CGROUP_PARENT
from tryloop.cli.train import ensure_suite
from tryloop.config import load_yaml
from tryloop.sandbox import SandboxRuntime
from tryloop.tasks.factory import build_humaneval
from tryloop.tasks.gate import GateConfig
from tryloop.tasks.store import TaskStore


def config(root):
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump({
        "runtime": {"store_dir": str(root / "rt"), "state_dir": str(root / "state"), "cgroup_name": CGROUP_PARENT},
        "tasks": {"store_url": str(root / "tasks"), "work_dir": str(root / "work"), "eval_fraction": 0.0},
        "train": {"source": "humaneval", "check_source": None}}))
    return load_yaml(path)


def must_not_build(*args, **kwargs):
    raise AssertionError("the suite was built again")


def test_a_killed_suite_build_resumes_where_it_stopped_and_a_finished_one_is_kept(tmp_path):
    cfg = config(tmp_path)

    async def killed(*args, **kwargs):
        await build_humaneval(*args, limit=2, **kwargs)
        raise KeyboardInterrupt  # the kill lands after two tasks were decided

    with pytest.raises(KeyboardInterrupt):
        ensure_suite(cfg, {"humaneval": killed})
    store = TaskStore(cfg.tasks.store_url)
    assert store.build_state("humaneval") == "started"
    first = {e.id: (e.fingerprint, e.added) for e in store.entries()}
    assert len(store.decided_ids("humaneval")) == 2

    gated: list[str] = []

    async def whole(*args, progress, **kwargs):     # "the whole source": four tasks here
        def seen(task_id, result):
            gated.append(task_id)
            progress(task_id, result)
        return await build_humaneval(*args, limit=4, progress=seen, **kwargs)

    ensure_suite(cfg, {"humaneval": whole})
    assert store.build_state("humaneval") == "done"
    assert len(gated) == 2 and not set(gated) & set(first)       # only what the killed build had not decided
    after = {e.id: (e.fingerprint, e.added) for e in store.entries()}
    assert len(store.decided_ids("humaneval")) == 4
    assert all(after[i] == first[i] for i in first)              # nothing decided before was redone

    ensure_suite(cfg, {"humaneval": must_not_build})             # a finished build is not run again


def test_tasks_built_by_hand_are_used_as_they_are(tmp_path):
    cfg = config(tmp_path)
    store = TaskStore(cfg.tasks.store_url)
    asyncio.run(build_humaneval(SandboxRuntime(cfg.runtime), store, tmp_path / "work", gate=GateConfig(k=1),
                                eval_fraction=0.0, limit=1))
    assert store.build_state("humaneval") is None
    ensure_suite(cfg, {"humaneval": must_not_build})


def test_a_finished_build_of_a_source_that_changed_gates_only_the_tasks_the_store_lacks(tmp_path):
    cfg = config(tmp_path)
    store = TaskStore(cfg.tasks.store_url)

    async def first(*args, **kwargs):                  # release A: the source has two tasks
        return await build_humaneval(*args, limit=2, **kwargs)

    ensure_suite(cfg, {"humaneval": first}, keys={"humaneval": "release-a"})
    assert store.build_state("humaneval") == "done" and store.build_key("humaneval") == "release-a"
    before = {e.id: (e.fingerprint, e.added) for e in store.entries()}
    ensure_suite(cfg, {"humaneval": must_not_build}, keys={"humaneval": "release-a"})

    gated: list[str] = []

    async def grown(*args, progress, **kwargs):        # release B adds a third
        def seen(task_id, result):
            gated.append(task_id)
            progress(task_id, result)
        return await build_humaneval(*args, limit=3, progress=seen, **kwargs)

    ensure_suite(cfg, {"humaneval": grown}, keys={"humaneval": "release-b"})
    assert len(gated) == 1 and gated[0] not in before
    after = {e.id: (e.fingerprint, e.added) for e in store.entries()}
    assert len(after) == 3 and all(after[i] == before[i] for i in before)
    assert store.build_state("humaneval") == "done" and store.build_key("humaneval") == "release-b"
    ensure_suite(cfg, {"humaneval": must_not_build}, keys={"humaneval": "release-b"})


def test_the_function_sources_key_follows_its_tasks():
    from tryloop.tasks.factory import default_build_key
    from tryloop.tasks.sources.functions import build_key

    assert default_build_key("functions") == build_key() == build_key(seed=0)
    assert build_key(seed=1) != build_key() and build_key(per_family=2) != build_key()
    assert default_build_key("humaneval") is None


def test_a_source_train_cannot_build_names_the_field_and_the_sources_there_are(tmp_path):
    from tryloop.errors import TryloopError

    cfg = config(tmp_path)
    cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"source": "fucntions"})})
    with pytest.raises(TryloopError, match=r"train.source: no train tasks of source 'fucntions'") as e:
        ensure_suite(cfg, {"humaneval": must_not_build, "functions": must_not_build})
    assert "(functions, humaneval)" in str(e.value)
