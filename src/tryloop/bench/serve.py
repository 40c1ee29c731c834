"""`tryloop bench serve`: many concurrent sessions of the environment server, beside the in-process API.

One run, two phases on the same tasks (bundled function-level tasks, made in a temporary
directory) and the same sandbox runtime:

    served       the server on a free local port (its own thread and event loop); a scripted
                 client opens `sessions` WebSocket sessions at once, and each plays the same
                 script: reset, then `steps` tool calls (view the answer file, a shell command,
                 ...), each timed from send to reply. The first `verify` sessions then write the
                 reference answer and submit (timed apart: that step includes the verifier); the
                 others close, which releases their sandboxes.
    in-process   the same number of episodes at once through `run_episode` with a scripted policy
                 doing the same tool calls, each step timed from the policy's action to the next
                 observation; the same first `verify` episodes submit, the others are cancelled.

Afterwards nothing may be left: no sandbox record in the runtime's state directory, no server
thread (the server's shutdown closes every session). The figures depend on the machine; on a
small one the step latency at high concurrency is mostly sandboxes and clients competing for the
same cores.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from tryloop.agent.environments import Environments
from tryloop.agent.episode import EpisodeRequest, run_episode
from tryloop.agent.policy import Action, TokenLog
from tryloop.agent.trajectory import Observation, ToolCall
from tryloop.bench.reward import pct
from tryloop.config import TryloopConfig
from tryloop.sandbox import SandboxRuntime
from tryloop.tasks.model import Task
from tryloop.tasks.sources.functions import function_tasks
from tryloop.tasks.store import TaskStore


def script(task: Task, steps: int) -> list[dict[str, Any]]:
    """The tool calls every session makes before it submits or leaves: cheap, real tool runs."""
    calls = [{"name": "view", "arguments": {"path": task.meta.answer_file}},
             {"name": "shell", "arguments": {"command": "ls -la && echo ok"}},
             {"name": "search", "arguments": {"pattern": "def ", "path": "."}}]
    return [{"tool_calls": [calls[i % len(calls)]]} for i in range(steps)]


def answer(task: Task) -> dict[str, Any]:
    code = task.solution_files()[task.meta.answer_file].decode()
    return {"tool_calls": [{"name": "write", "arguments": {"path": task.meta.answer_file, "content": code}},
                           {"name": "submit", "arguments": {}}]}


def summary(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {"n": 0}
    return {"n": len(xs), "p50_ms": pct(xs, 50) * 1000, "p99_ms": pct(xs, 99) * 1000, "max_ms": max(xs) * 1000}


# -- served ----------------------------------------------------------------------------------
async def _served(url: str, tasks: list[Task], sessions: int, steps: int, verify: int) -> dict[str, Any]:
    from tryloop.serve.client import AsyncEnvClient

    step_s: list[float] = []
    reset_s: list[float] = []
    submit_s: list[float] = []
    verdicts: dict[str, int] = {}
    all_open = asyncio.Event()
    pending = sessions

    async def one(i: int) -> None:
        nonlocal pending
        task = tasks[i % len(tasks)]
        env = AsyncEnvClient(url, timeout_s=600)
        try:
            t0 = time.perf_counter()
            await env.reset(task.id)
            reset_s.append(time.perf_counter() - t0)
        except BaseException:
            await env.close()
            raise
        finally:     # a session that failed to open must not hold the others back
            pending -= 1
            if pending == 0:
                all_open.set()
        async with env:
            await all_open.wait()          # every session is open before any step: `sessions` at once
            for action in script(task, steps):
                t0 = time.perf_counter()
                await env.step(action)
                step_s.append(time.perf_counter() - t0)
            if i < verify:
                t0 = time.perf_counter()
                r = await env.step(answer(task))
                submit_s.append(time.perf_counter() - t0)
                state = (r.verdict or {}).get("state", "none")
                verdicts[state] = verdicts.get(state, 0) + 1

    results = await asyncio.gather(*(one(i) for i in range(sessions)), return_exceptions=True)
    errors = [f"{type(r).__name__}: {r}" for r in results if isinstance(r, BaseException)]
    return {"reset": summary(reset_s), "step": summary(step_s), "submit": summary(submit_s),
            "verdicts": verdicts, "errors": len(errors), "error_examples": errors[:3]}


# -- in-process ------------------------------------------------------------------------------
class _Scripted:
    """A policy session that plays the script and times each step (action out -> observations in)."""

    def __init__(self, actions: list[dict[str, Any]], step_s: list[float], hold: asyncio.Event,
                 submit: dict[str, Any] | None, opened: asyncio.Barrier):
        self.tokens = TokenLog(source="unavailable")
        self.messages: list[dict[str, Any]] = []
        self.actions, self.step_s, self.hold, self.submit = list(actions), step_s, hold, submit
        self.opened = opened
        self.t_sent: float | None = None
        self.scripted_done = asyncio.Event()

    async def act(self, observations: list[Observation] | None) -> Action:
        if observations is None:
            await self.opened.wait()      # as the served sessions do: every episode open before any step
        if self.t_sent is not None and self.actions is not None:
            self.step_s.append(time.perf_counter() - self.t_sent)
        if not self.actions:
            self.scripted_done.set()
            await self.hold.wait()        # as the served sessions do: all finish their steps first
            if self.submit is None:
                await asyncio.Event().wait()  # never: this episode is cancelled, as a closed session is
            self.actions = None
            calls = self.submit["tool_calls"]
        else:
            calls = self.actions.pop(0)["tool_calls"]
        self.t_sent = time.perf_counter()
        return Action("", [ToolCall(c["name"], dict(c["arguments"])) for c in calls])


class _Policy:
    name, version = "bench-script", "none"

    def __init__(self, sess: _Scripted):
        self.sess = sess

    def session(self, system: str, instruction: str, *, seed: int = 0, task: Task | None = None) -> _Scripted:
        return self.sess


async def _in_process(cfg: TryloopConfig, tasks: list[Task], sessions: int, steps: int,
                      verify: int) -> dict[str, Any]:
    runtime = SandboxRuntime(cfg.runtime)
    scfg = cfg.serve.env
    envs = Environments(runtime, per_task=scfg.pool_per_task, max_live=sessions + scfg.pool_per_task)
    limits = scfg.limits.model_copy(update={"max_turns": steps + 2})
    step_s: list[float] = []
    hold = asyncio.Event()
    opened = asyncio.Barrier(sessions)
    sess = [_Scripted(script(tasks[i % len(tasks)], steps), step_s, hold,
                      answer(tasks[i % len(tasks)]) if i < verify else None, opened) for i in range(sessions)]
    runs = [asyncio.ensure_future(run_episode(EpisodeRequest(f"bench-{i}", tasks[i % len(tasks)], run_id="bench"),
                                              _Policy(s), envs, limits=limits, spec=cfg.rewards.spec))
            for i, s in enumerate(sess)]
    try:
        await asyncio.gather(*(s.scripted_done.wait() for s in sess))
        t0 = time.perf_counter()
        hold.set()
        judged = await asyncio.gather(*runs[:verify])
        verify_wall = time.perf_counter() - t0
        for r in runs[verify:]:
            r.cancel()
        await asyncio.gather(*runs[verify:], return_exceptions=True)
    finally:
        for r in runs:
            r.cancel()
        await asyncio.gather(*runs, return_exceptions=True)
        await envs.close()
        await runtime.close_all()
    verdicts: dict[str, int] = {}
    for t in judged:
        verdicts[str(t.verdict)] = verdicts.get(str(t.verdict), 0) + 1
    return {"step": summary(step_s), "verify_wall_s": verify_wall, "verdicts": verdicts,
            "verify_s": summary([t.times["verify"] for t in judged])}


# -- the run ---------------------------------------------------------------------------------
def _raise_fd_limit(need: int) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(need, soft)), hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def _leftovers(cfg: TryloopConfig) -> list[str]:
    records = Path(cfg.runtime.state_dir) / "sandboxes"
    return sorted(p.name for p in records.glob("*.json")) if records.exists() else []


def run(cfg: TryloopConfig, *, sessions: int, steps: int, verify: int, out: Path | None,
        console: Console) -> dict[str, Any]:
    from tryloop.serve.server import serve_in_thread

    fds = _raise_fd_limit(sessions * 16 + 1024)      # a socket, a sandbox's pidfd and pipes, per session
    verify = min(verify, sessions)
    before = set(_leftovers(cfg))
    threads_before = threading.active_count()
    res: dict[str, Any] = {"sessions": sessions, "steps_per_session": steps, "verify": verify, "fd_limit": fds}
    with tempfile.TemporaryDirectory() as tmp:
        store = TaskStore(Path(tmp) / "tasks")
        tasks = function_tasks(Path(tmp) / "src", per_family=1, families=["affine", "add-suffix"])
        for t in tasks:
            store.add(t)
        scfg = cfg.serve.env.model_copy(update={"port": 0, "host": "127.0.0.1", "auth_token_env": None,
                                                "access_log": None, "max_sessions": sessions,
                                                "idle_timeout_s": 600.0,
                                                "limits": cfg.serve.env.limits.model_copy(
                                                    update={"max_turns": steps + 2})})
        # The server's scheduler bounds tool runs at scheduler.capacity.execution_slots (default: the
        # CPU count); unset, the bench lifts it to `sessions`, as unbounded as the in-process side.
        cap = cfg.scheduler.capacity
        sched = cfg.scheduler.model_copy(update={"capacity": cap.model_copy(update={
            "execution_slots": cap.execution_slots or sessions})})
        # Tasks and recorded episodes live in the temporary directory: nothing is left behind.
        bcfg = cfg.model_copy(update={
            "serve": cfg.serve.model_copy(update={"env": scfg}), "scheduler": sched,
            "tasks": cfg.tasks.model_copy(update={"store_url": str(Path(tmp) / "tasks")}),
            "store": cfg.store.model_copy(update={"trajectories_url": str(Path(tmp) / "trajectories")})})
        with console.status(f"served: {sessions} sessions at once ..."):
            t0 = time.perf_counter()
            with serve_in_thread(bcfg, tasks) as url:
                res["served"] = asyncio.run(_served(url, tasks, sessions, steps, verify))
            res["served"]["wall_s"] = time.perf_counter() - t0
        with console.status(f"in-process: {sessions} episodes at once ..."):
            t0 = time.perf_counter()
            res["in_process"] = asyncio.run(_in_process(bcfg, tasks, sessions, steps, verify))
            res["in_process"]["wall_s"] = time.perf_counter() - t0
    time.sleep(0.5)
    res["left_behind"] = {"sandboxes": sorted(set(_leftovers(cfg)) - before),
                          "threads": max(0, threading.active_count() - threads_before)}
    s, p = res["served"], res["in_process"]
    ratio = (s["step"].get("p50_ms", 0) / p["step"]["p50_ms"]) if p["step"].get("p50_ms") else float("nan")
    res["ratio_p50"] = ratio
    t = Table(title=f"tryloop serve env: {sessions} concurrent sessions x {steps} steps ({verify} submitted)")
    for col in ("", "step p50", "step p99", "step max", "submit (with verifier) p50", "verdicts", "errors", "wall"):
        t.add_column(col)

    def ms(d: dict, k: str) -> str:
        return f"{d[k]:.1f} ms" if k in d else "-"

    t.add_row("served (WebSocket)", ms(s["step"], "p50_ms"), ms(s["step"], "p99_ms"), ms(s["step"], "max_ms"),
              ms(s["submit"], "p50_ms"), json.dumps(s["verdicts"]), str(s["errors"]), f"{s['wall_s']:.1f} s")
    t.add_row("in-process (run_episode)", ms(p["step"], "p50_ms"), ms(p["step"], "p99_ms"), ms(p["step"], "max_ms"),
              ms(p["verify_s"], "p50_ms") + " (verifier only)", json.dumps(p["verdicts"]), "0",
              f"{p['wall_s']:.1f} s")
    console.print(t)
    console.print(f"reset p50 {ms(s['reset'], 'p50_ms')}, p99 {ms(s['reset'], 'p99_ms')}; served/in-process step "
                  f"p50 {ratio:.2f}x; left behind: {len(res['left_behind']['sandboxes'])} sandbox(es), "
                  f"{res['left_behind']['threads']} thread(s)")
    if s["errors"]:
        console.print(f"[red]{s['errors']} session(s) failed[/], e.g. {s['error_examples']}")
    if out:
        out.write_text(json.dumps(res, indent=1))
    return res
