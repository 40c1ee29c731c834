"""`tryloop serve env` as a real subprocess: it serves, stops cleanly on SIGINT, and refuses bad settings by name."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import yaml

from host import CGROUP_PARENT
from tryloop.tasks.sources.functions import function_tasks
from tryloop.tasks.store import TaskStore

TRYLOOP = Path(sys.executable).parent / "tryloop"
ENV = {**os.environ, "COLUMNS": "400", "NO_COLOR": "1", "TERM": "dumb"}


def _config(tmp: Path, **serve_env) -> Path:
    path = tmp / "tryloop.yaml"
    path.write_text(yaml.safe_dump({
        "tasks": {"store_url": str(tmp / "tasks")},
        "store": {"trajectories_url": str(tmp / "trajectories")},
        "runtime": {"store_dir": str(tmp / "rt"), "state_dir": str(tmp / "state"), "cgroup_name": CGROUP_PARENT},
        "serve": {"env": {"port": 0, **serve_env}}}))
    return path


def test_serve_env_serves_and_stops_on_sigint(tmp_path):
    store = TaskStore(tmp_path / "tasks")
    task = function_tasks(tmp_path / "src", per_family=1, families=["affine"])[0]
    store.add(task)
    cfg = _config(tmp_path, access_log=str(tmp_path / "access.log"))
    proc = subprocess.Popen([str(TRYLOOP), "serve", "env", "-c", str(cfg), "--max-sessions", "3",
                             "--run-id", "cli-run"], stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        url = None
        for line in proc.stderr:
            m = re.search(r"at (http://\S+)", line)
            if m:
                url = m.group(1)
                break
        assert url, "the server reports where it listens"
        assert httpx.get(f"{url}/health").json() == {"status": "healthy", "active_sessions": 0, "max_sessions": 3}
        assert httpx.get(f"{url}/metadata").json()["run_id"] == "cli-run"
        r = httpx.post(f"{url}/reset", json={"task_id": task.id}, timeout=60)
        assert r.status_code == 200 and r.json()["observation"]["instruction"] == task.instruction
        proc.send_signal(signal.SIGINT)       # with the episode still open
        assert proc.wait(60) == 130, "Ctrl-C's documented status, after a graceful shutdown"
        assert "Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    leftovers = [p for p in (tmp_path / "state").rglob("*") if p.is_file()] if (tmp_path / "state").exists() else []
    assert not leftovers, f"sandboxes left behind: {leftovers}"
    assert '"path": "/reset"' in (tmp_path / "access.log").read_text()


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in ENV.items() if k != "TRYLOOP_TEST_UNSET_TOKEN"}
    return subprocess.run([str(TRYLOOP), "serve", "env", *args], capture_output=True, text=True, env=env, timeout=60)


def test_bad_settings_are_named(tmp_path):
    TaskStore(tmp_path / "tasks")
    cfg = _config(tmp_path)
    r = _run("-c", str(cfg), "--auth-token-env", "TRYLOOP_TEST_UNSET_TOKEN")
    assert r.returncode == 78 and "serve.env.auth_token_env" in r.stderr and "TRYLOOP_TEST_UNSET_TOKEN" in r.stderr
    r = _run("-c", str(cfg), "--max-sessions", "0")
    assert r.returncode == 78 and "serve.env.max_sessions" in r.stderr
    r = _run("-c", str(cfg))
    assert r.returncode == 1 and "no tasks in the task store" in r.stderr and "build-default" in r.stderr
    assert "Traceback" not in r.stderr
