"""The quality gate: nothing enters the store unchecked.

Each candidate runs K times in fresh sandboxes in each of two states:

* the reference solution — every acceptance test must pass, K out of K;
* the broken initial state, which is also what a do-nothing attempt submits —
  at least one acceptance test must fail, K out of K.

A test whose outcome differs between runs of the same state is flaky: it is
dropped from the acceptance set (and the task rejected if nothing that tells
broken from fixed is left). The slowest run must fit the time budget. Every
rejection carries its reason; `GateReport` sums yield per source and operator.

A task declaring sub-steps (tryloop.rewards.substeps) must name a check for
each, one of them the fix (`substep_without_check`, `substeps_invalid`); with a
`repro` sub-step, the hidden tests run as a repro — alone, K times on the broken
state and K times over the reference — must meet it (`reference_misses_substep`).
"""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from tryloop.sandbox import SandboxRuntime
from tryloop.tasks.model import Task
from tryloop.tasks.testrun import TestRun, run_tests, sandbox_config_for, task_snapshot

FAILING = ("failed", "error")

# Rejection reasons, stable strings (reports and the store's rejection log use them).
REFERENCE_FAILS = "reference_fails"
BROKEN_PASSES = "broken_state_passes"
NO_PASS_TO_PASS = "no_test_still_passes"
FLAKY = "flaky"
TOO_SLOW = "too_slow"
NO_TESTS = "no_tests_reported"
INFRA = "infrastructure_error"
TIMEOUT = "test_run_timed_out"
UNKNOWN_ENVIRONMENT = "unknown_environment"


@dataclass
class GateConfig:
    k: int = 3
    time_budget_s: float = 60.0
    require_pass_to_pass: bool = False  # mutation tasks: others must still pass


@dataclass
class GateResult:
    task_id: str
    accepted: bool
    reason: str | None = None
    detail: str = ""
    fail_to_pass: list[str] = field(default_factory=list)
    pass_to_pass: list[str] = field(default_factory=list)
    flaky: list[str] = field(default_factory=list)
    max_test_s: float = 0.0
    broken_runs: list[TestRun] = field(default_factory=list)
    fixed_runs: list[TestRun] = field(default_factory=list)

    def __repr__(self) -> str:
        state = "accepted" if self.accepted else f"rejected ({self.reason}: {self.detail})"
        return f"<GateResult {self.task_id} {state} f2p={len(self.fail_to_pass)} p2p={len(self.pass_to_pass)}>"


def _stable(runs: list[TestRun]) -> tuple[dict[str, str], set[str]]:
    """Outcomes every run agrees on, and tests whose outcome differed between runs."""
    tests = set().union(*(r.outcomes for r in runs))
    agreed, flaky = {}, set()
    for t in tests:
        seen = {r.outcomes.get(t, "missing") for r in runs}
        if len(seen) == 1:
            agreed[t] = seen.pop()
        else:
            flaky.add(t)
    return agreed, flaky


def judge(task_id: str, broken: list[TestRun], fixed: list[TestRun], cfg: GateConfig) -> GateResult:
    """Decide from the runs (pure: no sandbox here, so the rules are unit-testable)."""
    res = GateResult(task_id, False, broken_runs=broken, fixed_runs=fixed)
    res.max_test_s = max((r.wall_s for r in broken + fixed), default=0.0)
    if any(r.timed_out for r in broken + fixed):
        res.reason, res.detail = TIMEOUT, "a test run hit the task's test timeout"
        return res
    if not fixed:  # validate() stopped after a first broken run that failed nothing
        res.reason, res.detail = BROKEN_PASSES, "no test fails on the broken state (a do-nothing attempt would pass)"
        return res
    if res.max_test_s > cfg.time_budget_s:
        res.reason, res.detail = TOO_SLOW, f"slowest run {res.max_test_s:.1f}s > budget {cfg.time_budget_s:.0f}s"
        return res
    if not all(r.reported for r in broken + fixed):
        res.reason, res.detail = NO_TESTS, ("the test command produced no per-test report (it ran no pytest "
                                            "session, or one that did not finish)")
        return res
    fixed_ok, fixed_flaky = _stable(fixed)
    broken_ok, broken_flaky = _stable(broken)
    res.flaky = sorted(fixed_flaky | broken_flaky)
    passing_fixed = {t for t, o in fixed_ok.items() if o == "passed"} - set(res.flaky)
    if not passing_fixed:
        if res.flaky:
            res.reason, res.detail = FLAKY, f"every test that passes with the reference is flaky: {res.flaky[:5]}"
        else:
            res.reason, res.detail = REFERENCE_FAILS, "no test passes with the reference solution"
        return res
    res.fail_to_pass = sorted(t for t in passing_fixed if broken_ok.get(t, "missing") in (*FAILING, "missing"))
    res.pass_to_pass = sorted(t for t in passing_fixed if broken_ok.get(t) == "passed")
    if not res.fail_to_pass:
        if res.flaky:
            res.reason, res.detail = FLAKY, f"only flaky tests tell broken from fixed: {res.flaky[:5]}"
        else:
            res.reason, res.detail = BROKEN_PASSES, "no test fails on the broken state (a do-nothing attempt would pass)"
        return res
    if cfg.require_pass_to_pass and not res.pass_to_pass:
        res.reason, res.detail = NO_PASS_TO_PASS, "the broken state fails every test"
        return res
    res.accepted = True
    if res.flaky:
        res.detail = f"dropped {len(res.flaky)} flaky test(s) from the acceptance set"
    return res


async def validate(runtime: SandboxRuntime, task: Task, cfg: GateConfig | None = None,
                   concurrency: int = 2) -> GateResult:
    """Run the gate on one task in fresh sandboxes (2K runs, `concurrency` at a time)."""
    from tryloop.agent.profiles import PROFILES

    cfg = cfg or GateConfig()
    if task.meta.environment not in PROFILES:  # no episode could be run on it
        return GateResult(task.id, False, UNKNOWN_ENVIRONMENT, f"[metadata.tryloop] environment "
                          f"{task.meta.environment!r} is not one of {', '.join(PROFILES)}")
    from tryloop.rewards import substeps

    try:  # sub-steps: each must name a check that exists (tryloop.rewards.substeps)
        substeps.validate_substeps(task)
    except substeps.SubStepError as e:
        return GateResult(task.id, False, e.reason, str(e))
    if task.meta.grader == "answer":  # data / document tasks: no tests to run (tryloop.tasks.families.gate)
        from tryloop.tasks.families.gate import validate_answer

        return await validate_answer(runtime, task, cfg)
    snap = task_snapshot(runtime, task, sandbox_config_for(task))
    sem = asyncio.Semaphore(concurrency)

    async def one(with_solution: bool, limit: float) -> TestRun:
        async with sem:
            return await run_tests(runtime, task, with_solution=with_solution, snapshot=snap, timeout=limit)

    try:
        # One reference run, then one broken run, before the rest: most candidates
        # that fail the gate fail here, and the other runs are saved. The reference
        # run's duration bounds the broken runs, so a mutant that loops forever is
        # cut off after seconds instead of at the task's test timeout.
        ref = await one(True, cfg.time_budget_s * 1.5)
        if ref.timed_out or not (ref.reported and ref.passing):
            return judge(task.id, [ref], [ref], cfg)
        limit = min(cfg.time_budget_s * 1.5, max(5.0, 10 * ref.wall_s))
        first = await one(False, limit)
        if first.timed_out or (first.reported and not any(o in FAILING for o in first.outcomes.values())):
            return judge(task.id, [first], [], cfg)
        runs = await asyncio.gather(*(one(s, limit) for s in [True] * (cfg.k - 1) + [False] * (cfg.k - 1)))
    except Exception as e:  # a sandbox that failed to start is no verdict on the task
        return GateResult(task.id, False, INFRA, f"{type(e).__name__}: {e}")
    fixed, broken = [ref, *runs[: cfg.k - 1]], [first, *runs[cfg.k - 1:]]
    res = judge(task.id, broken, fixed, cfg)
    if res.accepted and substeps.wants_repro(task):
        # The reference is a fix, not a test: its repro is the hidden tests themselves, run by the
        # repro check as an agent's tests would be (alone, on the broken workspace and over the fix).
        try:
            rep = await substeps.check_repro(runtime, task, task.hidden_tests(), runs=cfg.k, timeout=limit,
                                             snapshot=snap)
        except Exception as e:
            return GateResult(task.id, False, INFRA, f"{type(e).__name__}: {e}")
        if not rep.met:
            res.accepted, res.reason = False, substeps.SUBSTEP_UNMET
            res.detail = f"the hidden tests, run as a repro, do not reproduce the bug: {rep.reason}"
    return res


@dataclass
class GateReport:
    """Yield of a batch, overall and per source / operator, with rejection reasons."""

    kept: Counter = field(default_factory=Counter)
    rejected: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))
    test_seconds: float = 0.0

    def add(self, group: str, result: GateResult) -> None:
        self.test_seconds += sum(r.wall_s for r in result.broken_runs + result.fixed_runs)
        if result.accepted:
            self.kept[group] += 1
        else:
            self.rejected[group][result.reason or "unknown"] += 1

    def reject(self, group: str, reason: str) -> None:
        self.rejected[group][reason] += 1

    def merge(self, other: GateReport) -> None:
        self.kept.update(other.kept)
        for g, c in other.rejected.items():
            self.rejected[g].update(c)
        self.test_seconds += other.test_seconds

    def groups(self) -> list[str]:
        return sorted(set(self.kept) | set(self.rejected))

    def yield_of(self, group: str) -> float:
        total = self.kept[group] + sum(self.rejected[group].values())
        return self.kept[group] / total if total else 0.0

    @property
    def total_kept(self) -> int:
        return sum(self.kept.values())

    @property
    def total_rejected(self) -> int:
        return sum(sum(c.values()) for c in self.rejected.values())

    def reasons(self) -> Counter:
        out: Counter = Counter()
        for c in self.rejected.values():
            out.update(c)
        return out
