"""Run a task's tests in a fresh sandbox and read per-test outcomes.

The quality gate (and later the verifier) needs to know which tests passed, not
just an exit code. For pytest commands a small plugin, loaded from a directory
on PYTHONPATH, writes each test's outcome as JSON; the file is read back through
the sandbox file API. Hardening against an agent that tampers with this path is
the verifier's job (tryloop.rewards): here the workspace is the task's own.
"""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass, field
from typing import Literal

from tryloop.config import SandboxConfig, SandboxLimits
from tryloop.sandbox import SandboxRuntime, Snapshot
from tryloop.tasks.model import Task

Outcome = Literal["passed", "failed", "error", "skipped", "xfailed", "xpassed"]
REPORT_DIR = "/tmp/.tryloop-report"
REPORT_FILE = f"{REPORT_DIR}/report.json"

# How a pytest report decides a test's outcome. Shared, as source, by this plugin and the
# verifier's (tryloop.rewards.verifier), so the gate and the verifier classify alike.
OUTCOME_SOURCE = '''
def _outcome(report):
    """The test's outcome if this report decides it, else None."""
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        if hasattr(report, "wasxfail"):
            return "xfailed" if report.skipped else "xpassed"
        if report.failed:
            return "failed" if report.when == "call" else "error"
        return report.outcome
    if report.when == "teardown" and report.failed:
        return "error"
    return None
'''

PLUGIN = '''
"""tryloop's per-test outcome recorder (written by tryloop, loaded with -p)."""
import json, os

_results = {}
''' + OUTCOME_SOURCE + '''

def pytest_runtest_logreport(report):
    outcome = _outcome(report)
    if outcome is not None:
        _results[report.nodeid] = outcome

def pytest_collectreport(report):
    if report.failed:
        _results[report.nodeid or "<collection>"] = "error"

def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get("TRYLOOP_REPORT")
    if path:
        with open(path, "w") as f:
            json.dump({"exitstatus": int(exitstatus), "tests": _results}, f)
'''


@dataclass
class TestRun:
    """One execution of a task's test command."""

    __test__ = False  # not a pytest test class

    exit_code: int | None
    outcomes: dict[str, str] = field(default_factory=dict)
    wall_s: float = 0.0
    timed_out: bool = False
    output_tail: str = ""
    reported: bool = False  # the pytest plugin wrote a report

    def passed(self, test_ids: list[str]) -> bool:
        return all(self.outcomes.get(t) == "passed" for t in test_ids)

    @property
    def passing(self) -> set[str]:
        return {t for t, o in self.outcomes.items() if o == "passed"}


def is_pytest(command: str) -> bool:
    return "pytest" in command


def instrumented_command(command: str) -> str:
    """The test command with tryloop's outcome plugin loaded (for pytest commands)."""
    if not is_pytest(command):
        return command
    extra = "-p tryloop_report -p no:cacheprovider"
    words = shlex.split(command)
    idx = next((i for i, w in enumerate(words) if w.endswith("pytest")), None)
    if idx is None:
        return command
    return shlex.join([*words[: idx + 1], *extra.split(), *words[idx + 1:]])


def task_snapshot(runtime: SandboxRuntime, task: Task, config: SandboxConfig | None = None) -> Snapshot:
    """The snapshot an agent starts from: the workspace layer on the image (cached by content)."""
    return runtime.workspace_snapshot(task.workspace_dir, config=config)


def sandbox_config_for(task: Task) -> SandboxConfig:
    return SandboxConfig(network=task.meta.network, limits=SandboxLimits(
        memory_mb=task.meta.memory_mb, cpus=task.meta.cpus, exec_timeout_s=task.meta.test_timeout_s))


async def run_tests(runtime: SandboxRuntime, task: Task, *, with_solution: bool,
                    changes: dict[str, bytes] | None = None, snapshot: Snapshot | None = None,
                    timeout: float | None = None) -> TestRun:
    """Run the task's tests in a fresh sandbox on the initial workspace, optionally with
    the reference solution or other `changes` laid over it, then the hidden tests."""
    cfg = sandbox_config_for(task)
    snap = snapshot or task_snapshot(runtime, task, cfg)
    async with await runtime.create(snap, cfg) as sb:
        files: dict[str, bytes] = {}
        if with_solution:
            files.update(task.solution_files())
        files.update(changes or {})
        files.update(task.hidden_tests())  # last: tests always win
        for rel, data in files.items():
            sb.write_file(rel, data)
        sb.write_file(f"{REPORT_DIR}/tryloop_report.py", PLUGIN)
        t0 = time.perf_counter()
        res = await sb.exec(instrumented_command(task.meta.test_command), merge_stderr=True,
                            timeout=min(timeout or task.meta.test_timeout_s, task.meta.test_timeout_s),
                            env={"PYTHONPATH": ":".join(p for p in (REPORT_DIR, sb.env.get("PYTHONPATH")) if p),
                                 "TRYLOOP_REPORT": REPORT_FILE,
                                 "PYTHONDONTWRITEBYTECODE": "1"})
        wall = time.perf_counter() - t0
        run = TestRun(exit_code=res.exit_code, wall_s=wall, timed_out=res.timed_out,
                      output_tail=res.text()[-4000:])
        try:
            report = json.loads(sb.read_file(REPORT_FILE))
            run.outcomes = dict(report.get("tests", {}))
            run.reported = True
        except (FileNotFoundError, ValueError):
            pass
        return run
