"""A small real run for the dashboard's tests, written by the train loop's own writers: episodes
(Trajectory objects with turns, tool calls, a diff and the verifier's verdict fields) into the
Parquet trajectory store, per-step rows from `_step_metrics` appended with `_append_jsonl`,
held-out rows from `_eval_row` over `summarize`, and the live state file of a real scheduler and
pool registry. Generating them with a model would take minutes; the files are the same."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from prometheus_client import CollectorRegistry

from tryloop.agent.trajectory import Observation, ToolCall, Trajectory, Turn
from tryloop.eval.summary import summarize
from tryloop.rewards.verdict import Flag
from tryloop.rewards.verifier import encode_changes
from tryloop.sandbox.pool import PoolMetrics
from tryloop.scheduler.metrics import SchedulerMetrics
from tryloop.store.trajectories import TrajectoryStore
from tryloop.tasks.model import Task, TaskMeta
from tryloop.tasks.store import TaskStore
from tryloop.telemetry.live import write_state
from tryloop.train.advantages import compute_advantages
from tryloop.train.run import _append_jsonl, _eval_row, _step_metrics

RUN = "dash-run"
STEPS = 4
TASKS = ("mathkit/gcd", "strutils/slugify")
GROUP = 2


class _Envs:
    """What `_step_metrics` reads of the warm pools."""

    hit_rate = 0.75


def original(task: str) -> str:
    fn = task.split("/")[1]
    return f"def {fn}(a, b):\n    raise NotImplementedError\n"


def make_tasks(url: str, work: Path) -> dict[str, str]:
    """The run's tasks in a task store (their initial files are what the diffs compare against):
    task id -> fingerprint."""
    store = TaskStore(url)
    out = {}
    for task in TASKS:
        project, name = task.split("/")
        meta = TaskMeta(id=task, family=f"{project}-{name}", project=project, source="mutation")
        t = Task.create(work / project / name, meta, f"Implement {name}.",
                        workspace={f"{name}.py": original(task)}, tests={"tests/test_x.py": "def test(): pass\n"})
        out[task] = store.add(t).fingerprint
    return out


FINGERPRINTS: dict[str, str] = {}


def episode(run: str, step: int, task: str, i: int, *, passed: bool, flagged: bool = False) -> Trajectory:
    fn = task.split("/")[1]
    body = "    return a if b == 0 else gcd(b, a % b)\n" if passed else "    return 1\n"
    t = Trajectory(
        episode_id=f"{run}:{step}:{task}:{i}", task_id=task, task_fingerprint=FINGERPRINTS.get(task, f"fp-{fn}"), run_id=run, step=step,
        group_id=f"{step}:{task}", sample_index=i, policy="smollm2-135m", policy_version=f"step-{step - 1}",
        messages=[{"role": "user", "content": f"Fix {fn}."}],
        token_ids=list(range(40)), logprobs=[0.0] * 10 + [-0.5] * 30, loss_mask=[0] * 10 + [1] * 30,
        prompt_length=10,
        turns=[Turn(0, f"Let me look at {fn}.py first.", [ToolCall("shell", {"command": f"cat {fn}.py"}, "c0")],
                    [Observation("shell", original(task), exit_code=0,
                                 env_s=0.05)], completion_tokens=12, model_s=0.4, env_s=0.05, finish_reason="stop"),
               Turn(1, "Writing the fix and submitting.",
                    [ToolCall("write_file", {"path": f"{fn}.py", "content": f"def {fn}(a, b):\n{body}"}, "c1"),
                     ToolCall("submit", {}, "c2")],
                    [Observation("write_file", "ok"), Observation("submit", "submitted")],
                    completion_tokens=18, model_s=0.6, env_s=0.02, finish_reason="stop")],
        changes=encode_changes({f"{fn}.py": f"def {fn}(a, b):\n{body}".encode()}),
        termination="submitted", verdict="pass" if passed else "fail",
        reward=(1.0 if passed else 0.0) + 0.1 * (i % 2), reward_components={"correctness": 1.0 if passed else 0.0,
                                                                             "brevity": 0.1 * (i % 2)},
        reward_version="rv-test", verdict_reason="" if passed else "2 of 3 tests failed",
        times={"model": 1.0 + 0.1 * step, "env": 0.07, "verify": 0.5, "episode": 1.6, "total": 1.7},
        created_at=1_764_585_600.0 + step * 60 + i)
    if flagged:
        t.flags = [asdict(Flag("constant_eq", "returns a constant where tests compare", file=f"{fn}.py", line=2,
                               severity="suspicious"))]
    return t


def write_step(run_dir: Path, store: TrajectoryStore, step: int) -> dict:
    """One training step's episodes (durable first) and its metrics row, as the loop writes them."""
    trajs = [episode(RUN, step, task, i, passed=(step + i + n) % 3 != 0, flagged=step == 2 and n == 0 and i == 0)
             for n, task in enumerate(TASKS) for i in range(GROUP)]
    store.write(trajs)
    adv = compute_advantages(trajs)
    learn = {"loss": 0.5 / (step + 1), "grad_norm": 1.0 + 0.1 * step}
    row = _step_metrics(step, trajs, adv, learn, 2.0 + step * 0.1, _Envs(), refills=step % 2, step_s=9.0 + step)
    row["time_rollout_wall_s"] = 5.0 + 0.2 * step
    _append_jsonl(run_dir / "metrics.jsonl", row)
    return row


def write_eval(run_dir: Path, store: TrajectoryStore, step: int) -> dict:
    run_id = f"{RUN}-eval-{step}"
    trajs = [episode(run_id, 0, task, i, passed=(step + i) % 2 == 0) for task in TASKS for i in range(GROUP)]
    store.write(trajs)
    row = _eval_row(step, "held-out", run_id, GROUP, 1.0, summarize(trajs, k=GROUP), trajs)
    _append_jsonl(run_dir / "evals.jsonl", row)
    return row


def write_state_file(run_dir: Path, *, live: bool = True) -> None:
    registry = CollectorRegistry()
    sched = SchedulerMetrics(registry)
    sched.queue_depth.labels(queue="ready").set(3)
    sched.in_flight.labels(stage="generating").set(2)
    sched.admission_limit.set(4)
    pool = PoolMetrics(registry)
    pool.live.labels(pool="mathkit").set(5)
    pool.idle.labels(pool="mathkit").set(2)
    pool.acquired.labels(pool="mathkit", result="hit").inc(7)
    for seconds in (0.01, 0.03):
        pool.acquire.labels(pool="mathkit", result="hit").observe(seconds)
    write_state(run_dir / "state.json", registry, live=live)


def build_run(root: Path, steps: int = STEPS) -> tuple[Path, str, str]:
    """runs_dir/<RUN>, the trajectory store and the task store: `steps` steps, held-out evaluations
    before step 0 and after the last step. Returns (runs_dir, trajectories_url, tasks_url)."""
    runs_dir, url, tasks_url = root / "runs", str(root / "trajectories"), str(root / "tasks")
    FINGERPRINTS.update(make_tasks(tasks_url, root / "task-src"))
    run_dir = runs_dir / RUN
    run_dir.mkdir(parents=True)
    store = TrajectoryStore(url)
    (run_dir / "manifest.json").write_text(json.dumps({
        "run_id": RUN, "code_revision": "0123456789abcdef", "reward_spec_version": "rv-test",
        "train_tasks": list(TASKS), "eval_tasks": list(TASKS),
        "config": {"train": {"steps": steps, "group_size": GROUP, "policy": {"name": "smollm2-135m"}}}}))
    write_eval(run_dir, store, -1)
    for step in range(steps):
        write_step(run_dir, store, step)
    write_eval(run_dir, store, steps - 1)
    write_state_file(run_dir)
    return runs_dir, url, tasks_url
