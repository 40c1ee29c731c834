"""Run a task's tests in a fresh sandbox and read per-test outcomes.

The quality gate needs to know which tests passed, not just an exit code. The
runs go through the harness (tryloop.tasks.harness) the verifier uses: one runner,
so a task the gate accepts is judged by the verifier the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from tryloop.sandbox import SandboxRuntime, Snapshot
from tryloop.tasks import harness

# Their home is the harness; many callers import them from here.
from tryloop.tasks.harness import OUTCOME_SOURCE, sandbox_config_for, task_snapshot  # noqa: F401
from tryloop.tasks.model import Task

Outcome = Literal["passed", "failed", "error", "skipped", "xfailed", "xpassed"]


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


async def run_tests(runtime: SandboxRuntime, task: Task, *, with_solution: bool,
                    changes: dict[str, bytes] | None = None, snapshot: Snapshot | None = None,
                    timeout: float | None = None) -> TestRun:
    """Run the task's tests in a fresh sandbox on the initial workspace, optionally with
    the reference solution or other `changes` laid over it, then the hidden tests: through
    the verifier's harness (tryloop.tasks.harness), so the gate and the verifier see the
    same runs and the same authenticated per-test records."""
    hidden = task.hidden_tests()
    files: dict[str, bytes | None] = dict(task.solution_files()) if with_solution else {}
    files.update(changes or {})
    applied = {p: d for p, d in files.items() if p not in hidden}
    limit = min(timeout or task.meta.test_timeout_s, task.meta.test_timeout_s)
    rec = await harness.run(runtime, task, applied, hidden, limit, snapshot=snapshot)
    return TestRun(exit_code=rec.status if rec.status is not None else rec.exit_code, outcomes=rec.outcomes,
                   wall_s=rec.wall_s, timed_out=rec.timed_out, output_tail=rec.output_tail,
                   reported=rec.finished and not (rec.forged or rec.broken))
