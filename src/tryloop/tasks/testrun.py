"""Run a task's tests in a fresh sandbox and read per-test outcomes.

The quality gate needs to know which tests passed, not just an exit code. The
runs go through the verifier's harness (tryloop.rewards.harness): one runner,
so a task the gate accepts is judged by the verifier the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from tryloop.config import SandboxConfig, SandboxLimits
from tryloop.sandbox import SandboxRuntime, Snapshot
from tryloop.tasks.model import Task

Outcome = Literal["passed", "failed", "error", "skipped", "xfailed", "xpassed"]

# How a pytest report decides a test's outcome (source for the harness's test process).
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


@dataclass
class TestRun:
    """One execution of a task's test command."""

    __test__ = False  # not a pytest test class

    exit_code: int | None
    outcomes: dict[str, str] = field(default_factory=dict)
    wall_s: float = 0.0
    timed_out: bool = False
    output_tail: str = ""
    reported: bool = False  # every pytest session the command ran reported, authentically

    def passed(self, test_ids: list[str]) -> bool:
        return all(self.outcomes.get(t) == "passed" for t in test_ids)

    @property
    def passing(self) -> set[str]:
        return {t for t, o in self.outcomes.items() if o == "passed"}


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
    the reference solution or other `changes` laid over it, then the hidden tests: through
    the verifier's harness (tryloop.rewards.harness), so the gate and the verifier see the
    same runs and the same authenticated per-test records."""
    from tryloop.rewards import harness  # the harness builds on this module

    hidden = task.hidden_tests()
    files: dict[str, bytes | None] = dict(task.solution_files()) if with_solution else {}
    files.update(changes or {})
    applied = {p: d for p, d in files.items() if p not in hidden}
    limit = min(timeout or task.meta.test_timeout_s, task.meta.test_timeout_s)
    rec = await harness.run(runtime, task, applied, hidden, limit, snapshot=snapshot)
    return TestRun(exit_code=rec.status if rec.status is not None else rec.exit_code, outcomes=rec.outcomes,
                   wall_s=rec.wall_s, timed_out=rec.timed_out, output_tail=rec.output_tail,
                   reported=rec.finished and not (rec.forged or rec.broken))
