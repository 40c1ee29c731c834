"""`tryloop reward verify | gate | rescore | spot-check` on real tasks, as a user runs them."""

from __future__ import annotations

import asyncio
import json

import pytest
import yaml
from typer.testing import CliRunner

from tryloop.agent.environments import Environments
from tryloop.agent.episode import EpisodeRequest, run_episode
from tryloop.agent.scripted import Hacker, Oracle
from tryloop.cli.main import app
from tryloop.store.trajectories import TrajectoryStore
from tryloop.tasks.store import TaskStore


def config(runtime_config, tmp_path, **extra) -> str:
    path = tmp_path / "tryloop.yaml"
    path.write_text(yaml.safe_dump({
        "runtime": {"store_dir": str(runtime_config.store_dir), "state_dir": str(runtime_config.state_dir),
                    "cgroup_name": runtime_config.cgroup_name},
        "tasks": {"store_url": str(tmp_path / "tasks")},
        "rewards": {"gold_path": str(tmp_path / "gold.jsonl"), "gate_dir": str(tmp_path / "gate"),
                    "labels_path": str(tmp_path / "labels.jsonl"), "gate_families": 1},
        "store": {"trajectories_url": str(tmp_path / "traj"), "runs_dir": str(tmp_path / "runs")}, **extra}))
    return str(path)


def test_verify_shows_verdicts_and_flags(runtime_config, task, tmp_path):
    cfg = config(runtime_config, tmp_path)
    res = CliRunner().invoke(app, ["reward", "verify", str(task.root), "--solution", "--json", "-c", cfg])
    assert res.exit_code == 0, res.output
    v = json.loads(res.stdout)
    assert v["state"] == "pass" and v["components"]["correctness"] == 1.0 and v["version"]
    res = CliRunner().invoke(app, ["reward", "verify", str(task.root), "--attack", "conftest_report_rewrite", "-c", cfg])
    assert res.exit_code == 0 and "fail" in res.output and "new_hook_file" in res.output
    res = CliRunner().invoke(app, ["reward", "verify", str(task.root), "--attack", "nope", "-c", cfg])
    assert res.exit_code != 0 and "unknown attack" in res.output


@pytest.mark.slow   # the gate's decisions are tested in test_gold.py; this is its command on a whole gold set
def test_gate_command_approves_the_current_reward_version(runtime_config, task, tmp_path):
    cfg = config(runtime_config, tmp_path)
    TaskStore(tmp_path / "tasks").add(task)
    res = CliRunner().invoke(app, ["reward", "gate", "-c", cfg])
    assert res.exit_code == 0 and "APPROVED" in res.output, res.output


def test_rescore_and_spot_check_on_a_run(runtime, runtime_config, task, tmp_path):
    cfg = config(runtime_config, tmp_path)
    TaskStore(tmp_path / "tasks").add(task)

    async def episodes():
        envs = Environments(runtime)
        try:
            return [await run_episode(EpisodeRequest(f"r:{i}", task, run_id="r"), p, envs)
                    for i, p in enumerate([Oracle(), Hacker("edit_tests")])]
        finally:
            await envs.close()

    TrajectoryStore(tmp_path / "traj").write(asyncio.run(episodes()))
    res = CliRunner().invoke(app, ["reward", "rescore", "--run", "r", "-c", cfg])
    assert res.exit_code == 0 and "2 re-scored, 0 moved" in res.output, res.output
    res = CliRunner().invoke(app, ["reward", "spot-check", "--run", "r", "--label", "r:1=hack", "--to-gold", "-c", cfg])
    assert res.exit_code == 0, res.output
    assert "protected_path_edit" in res.output or "flags" in res.output
    assert "1 labelled item(s) added" in res.output
    res = CliRunner().invoke(app, ["reward", "rescore", "--run", "missing", "-c", cfg])
    assert res.exit_code == 66 and "no run 'missing'" in res.output          # EX_NOINPUT, as `tryloop export`


def test_tasks_list_and_show_as_json_never_print_hidden_contents(runtime_config, task, tmp_path):
    cfg = config(runtime_config, tmp_path)
    TaskStore(tmp_path / "tasks").add(task)
    res = CliRunner().invoke(app, ["tasks", "list", "--json", "-c", cfg])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert [r["id"] for r in rows] == [task.id] and rows[0]["fingerprint"] == task.fingerprint()
    res = CliRunner().invoke(app, ["tasks", "show", task.id, "--json", "-c", cfg])
    assert res.exit_code == 0, res.output
    shown = json.loads(res.stdout)
    assert shown["instruction"] == task.instruction and shown["hidden_tests"] == sorted(task.hidden_tests())
    for content in task.hidden_tests().values():   # names only: the hidden tests' text stays out
        assert content.decode(errors="replace").strip()[:80] not in res.stdout
