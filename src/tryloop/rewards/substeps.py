"""Sub-steps of code tasks: "a test that reproduces the bug", then "the fix passes".

A test-graded task may declare ordered sub-steps (`[metadata.tryloop.substeps]`,
`tryloop.tasks.model.SubSteps`), each naming its acceptance check:

* `tests` — the fix: the task's own verdict (every expected hidden test passes);
* `repro` — a test of the agent's reproduces the bug: among the files the agent
  added or changed outside the protected paths, the test files (`test_*.py`,
  `*_test.py`) are laid, alone, over two fresh sandboxes — the pristine broken
  workspace, and the workspace with the reference fix — and run there under the
  verifier's harness (tryloop.tasks.harness, with those files as pytest's
  arguments; no hidden test is laid). The sub-step is met when at least one of
  the agent's tests fails (or errors) on the broken workspace and passes with
  the reference, in every one of `repro_runs` runs of each state. The two states
  differ only by the reference fix, so a test that fails by itself (`assert
  False`), passes on the broken code, is not collected, or fails for a reason
  the fix does not remove, does not meet it. A test that reproduces must also
  fail on a third state: the broken code rewritten without changing what it
  does (the modules the fix touches reformatted, their local names renamed, a
  comment added). A test that tells the fix from the bug by the code's text,
  size, digest or time stamp rather than by its behaviour passes there, and
  does not meet it.

The agent's test files are the repro's only: the fix run does not get them
(they can neither help nor break the hidden tests), and the agent's other
changes never enter the repro runs. The verdict reports each sub-step
(`meta["substeps"]`: `step:<name>` -> passed | failed), splits the reward
spec's `tests` component by the sub-steps' weights and records each one's part
(`meta["substep_rewards"]`, for per-turn credit in training). The verdict's
state stays the fix's.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import asdict, dataclass, field
from typing import Any

from tryloop.errors import SandboxError
from tryloop.rewards.verdict import Changes, Flag
from tryloop.sandbox import SandboxRuntime, Snapshot
from tryloop.tasks import harness
from tryloop.tasks.model import CODE_CHECKS, Task, TaskError

REPRO, TESTS = "repro", "tests"
FAILING = ("failed", "error")

# Gate rejection reasons (stable strings).
SUBSTEP_WITHOUT_CHECK = "substep_without_check"
SUBSTEPS_INVALID = "substeps_invalid"
SUBSTEP_UNMET = "reference_misses_substep"

# Per-turn tracking checks at most this many distinct states of the agent's tests per episode.
MAX_TRACKED_CHECKS = 6


class SubStepError(TaskError):
    """A task's sub-step declaration is unusable; `reason` is a gate rejection reason."""

    def __init__(self, message: str, reason: str = SUBSTEPS_INVALID):
        super().__init__(message)
        self.reason = reason


def validate_substeps(task: Task) -> None:
    """Raise `SubStepError` (with the gate's reason) when the declared sub-steps cannot be judged."""
    decl = task.meta.substeps
    if decl is None:
        return
    where = f"task {task.id}: [metadata.tryloop.substeps]"
    if task.meta.grader != "tests":
        raise SubStepError(f"{where}: an answer-graded task declares its sub-steps in tests/check.json")
    for s in decl.steps:
        if not s.check:
            raise SubStepError(f"{where}: sub-step {s.name!r} has no check (one of {', '.join(CODE_CHECKS)})",
                               SUBSTEP_WITHOUT_CHECK)
        if s.check not in CODE_CHECKS:
            raise SubStepError(f"{where}: sub-step {s.name!r} names the check {s.check!r}, which does not "
                               f"exist (one of {', '.join(CODE_CHECKS)})", SUBSTEP_WITHOUT_CHECK)
    names = [s.name for s in decl.steps]
    if len(set(names)) != len(names):
        raise SubStepError(f"{where}: sub-step names must be unique: {names}")
    checks = [s.check for s in decl.steps]
    if len(set(checks)) != len(checks):
        raise SubStepError(f"{where}: each check may be named once: {checks}")
    if TESTS not in checks:
        raise SubStepError(f"{where}: no sub-step is the fix (check {TESTS!r}): the task's verdict must be one")
    if sum(s.weight for s in decl.steps) <= 0:
        raise SubStepError(f"{where}: the sub-steps' weights sum to 0")
    if REPRO in checks and not task.solution_files():
        raise SubStepError(f"{where}: a {REPRO!r} sub-step needs the task's reference solution")


def wants_repro(task: Task) -> bool:
    decl = task.meta.substeps
    return decl is not None and any(s.check == REPRO for s in decl.steps)


def is_test_file(path: str) -> bool:
    """A file pytest collects by default: test_*.py or *_test.py."""
    name = path.rsplit("/", 1)[-1]
    return name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py"))


def agent_tests(applied: Changes) -> dict[str, bytes]:
    """The agent's test files among the changes the verifier applies (protected paths already refused)."""
    return {p: d for p, d in sorted(applied.items()) if d is not None and is_test_file(p)}


def digest(files: dict[str, bytes | None]) -> str:
    h = hashlib.sha256()
    for k in sorted(files):
        d = files[k]
        h.update(k.encode() + b"\0" + (b"-" if d is None else hashlib.sha256(d).digest()))
    return h.hexdigest()[:24]


# ---- the repro check --------------------------------------------------------------

@dataclass
class Repro:
    """Whether the agent's tests reproduce the bug, and the evidence."""

    met: bool
    reason: str = ""
    files: list[str] = field(default_factory=list)
    reproduced: list[str] = field(default_factory=list)     # fail on broken, pass with the reference
    broken: dict[str, str] = field(default_factory=dict)    # outcomes every broken run agreed on
    reference: dict[str, str] = field(default_factory=dict)
    flaky: list[str] = field(default_factory=list)
    flags: list[Flag] = field(default_factory=list)        # runtime evidence of the agent's tests
    wall_s: float = 0.0

    def summary(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("flags")
        return d


def _complete(r: harness.RunRecord) -> bool:
    """A run that finished in time with a clean report: every record signed, none malformed."""
    return not (r.timed_out or not r.finished or r.forged or r.broken)


_cache: dict[str, Repro] = {}
CACHE_SIZE = 4096   # results kept in the process (the oldest go first)


async def check_repro(runtime: SandboxRuntime, task: Task, tests: dict[str, bytes], *, runs: int = 2,
                      timeout: float | None = None, snapshot: Snapshot | None = None) -> Repro:
    """Run `tests` (test files, with any helper files beside them) alone on the pristine workspace and
    over the reference fix, `runs` times each, in fresh sandboxes through the harness (the first run of
    each state decides whether the others are needed). Cached per task version, code version and test
    contents: the tracker and the verifier ask about the same files."""
    from tryloop.rewards.verifier import REPORT_FORGED, evidence_flag
    from tryloop.rewards.version import code_version
    from tryloop.tasks.gate import _stable

    paths = sorted(p for p in tests if is_test_file(p))
    if not paths:
        return Repro(False, "no test file of the agent's (test_*.py or *_test.py outside the protected paths)")
    key = f"{task.fingerprint()[:24]}-{code_version()}-{runs}-{digest(dict(tests))}"
    if key in _cache:
        return _cache[key]
    limit = timeout or task.meta.test_timeout_s
    reference = {p: d for p, d in task.solution_files().items() if p not in tests}
    snap = snapshot or harness.task_snapshot(runtime, task, harness.sandbox_config_for(task))
    sem = asyncio.Semaphore(2)

    async def one(files: Changes) -> harness.RunRecord:
        async with sem:
            return await harness.run(runtime, task, files, {}, limit, snapshot=snap, argv=["-q", *paths])

    # One run of each state first: most tests that are no repro show it there, and the rest are saved.
    b0, r0 = await asyncio.gather(one(dict(tests)), one({**reference, **tests}))
    broken_runs, ref_runs = [b0], [r0]
    if runs > 1 and any(o == "passed" and b0.outcomes.get(t) in FAILING for t, o in r0.outcomes.items()):
        more = await asyncio.gather(*[one(dict(tests)) for _ in range(runs - 1)],
                                    *[one({**reference, **tests}) for _ in range(runs - 1)])
        broken_runs += more[: runs - 1]
        ref_runs += more[runs - 1:]
    recs = broken_runs + ref_runs
    res = Repro(False, files=paths, wall_s=max(r.wall_s for r in recs))
    for r in recs:
        res.flags += [f for f in (evidence_flag(e) for e in r.evidence) if f not in res.flags]
        if r.forged and not any(f.kind == REPORT_FORGED for f in res.flags):
            res.flags.append(Flag(REPORT_FORGED, f"{r.forged} record(s) of a repro run failed authentication"))
    res.broken, broken_flaky = _stable(broken_runs)
    res.reference, ref_flaky = _stable(ref_runs)
    res.flaky = sorted(broken_flaky | ref_flaky)
    untrusted = [r for r in recs if not _complete(r) or any(e.severity == "hack" for e in r.evidence)]
    if untrusted:
        r = untrusted[0]
        res.reason = ("a run of the agent's tests timed out" if r.timed_out else
                      f"a run of the agent's tests gave no clean complete report (exit {r.exit_code})")
    else:
        passing = sorted(t for t, o in res.reference.items() if o == "passed" and t not in res.flaky)
        res.reproduced = [t for t in passing if res.broken.get(t) in FAILING]
        text_only: list[str] = []
        if res.reproduced:   # the broken code rewritten: a test of the behaviour still fails there
            v = await one({**rewritten_broken(task, tests), **tests})
            res.flags += [f for f in (evidence_flag(e) for e in v.evidence) if f not in res.flags]
            res.wall_s = max(res.wall_s, v.wall_s)
            if not _complete(v):
                res.reproduced, res.reason = [], "the run of the agent's tests on the rewritten broken code " \
                                                 "gave no clean complete report"
            else:
                text_only = [t for t in res.reproduced if v.outcomes.get(t) not in FAILING]
                res.reproduced = [t for t in res.reproduced if t not in text_only]
        res.met = bool(res.reproduced)
        if res.met or res.reason:
            pass
        elif text_only:
            res.reason = ("every test of the agent's that tells the fix from the bug passes on the broken code "
                          "rewritten without changing its behaviour (reformatted, renamed): it tells the code's text "
                          f"apart, not what it does: {text_only[:3]}")
        elif not res.reference and not res.broken:
            res.reason = "the agent's test files collected no test"
        elif not passing:
            res.reason = ("no test of the agent's passes with the reference fix" +
                          (f" (flaky: {res.flaky[:3]})" if res.flaky else ""))
        else:
            res.reason = f"every test of the agent's that passes with the reference fix passes on the broken " \
                         f"workspace too (or was not collected there): {passing[:3]}"
        _cache[key] = res
        while len(_cache) > CACHE_SIZE:
            del _cache[next(iter(_cache))]
    return res


def rewritten_broken(task: Task, tests: dict[str, bytes]) -> Changes:
    """The broken code of the modules the reference fix changes, rewritten without changing what it
    does: reformatted, local names renamed (never one the project or the agent's tests name in a
    string or keyword), and a comment at the end, so that no byte count or digest stays the same."""
    from tryloop.tasks.variants import observed_names, reformat, rename_identifiers

    ws = task.workspace_files()
    paths = sorted(p for p in task.solution_files() if p.endswith(".py") and p in ws and not is_test_file(p))
    texts = [d.decode("utf-8", "replace") for d in (*ws.values(), *tests.values())]
    seed = int(task.fingerprint()[:8], 16)
    rewritten = reformat(rename_identifiers({p: ws[p] for p in paths}, seed, observed=observed_names(texts)))
    out: Changes = {}
    for p, data in rewritten.items():
        text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
        out[p] = (text.rstrip("\n") + f"\n# {hashlib.sha256(f'{seed}:{p}'.encode()).hexdigest()[:16]}\n").encode()
    return out


# ---- the verdict ----------------------------------------------------------------------

def score(task: Task, spec: Any, verdict: Any, comps: dict[str, float], *, state: str, passed: int,
          expected: int, repro: Repro | None) -> None:
    """Each sub-step's verdict and score; the `tests` components become the sub-steps' weighted
    score, and each sub-step's part of them is recorded (`substep_rewards`)."""
    decl = task.meta.substeps
    assert decl is not None
    outcomes: dict[str, str] = {}
    scores: dict[str, float] = {}
    weights: dict[str, float] = {}
    for s in decl.steps:
        key = f"step:{s.name}"
        if s.check == TESTS:
            ok = state == "pass"
            scores[key] = passed / expected if spec.partial_credit and expected else float(ok)
        else:
            ok = repro is not None and repro.met
            scores[key] = float(ok)
        outcomes[key], weights[key] = ("passed" if ok else "failed"), s.weight
    total_w = sum(weights.values())
    value = sum(weights[k] * scores[k] for k in weights) / total_w
    w = 0.0
    for c in spec.components:
        if c.kind == "tests":
            comps[c.name] = value
            w += c.weight
    verdict.meta["substeps"] = outcomes
    verdict.meta["substep_scores"] = scores
    verdict.meta["substep_rewards"] = {k: w * weights[k] * scores[k] / total_w for k in weights}
    if repro is not None:
        verdict.meta["repro"] = repro.summary()


# ---- per-turn tracking ----------------------------------------------------------------

class CodeStepTracker:
    """The turn at which each sub-step of a code task was first met, for a task that asks (`track`).

    Cheap by design: after each turn only the workspace is read (the diff the episode takes at the
    end anyway), and the agent's test files and the rest of the diff are hashed. Nothing runs
    during the episode. After the verdict:

    * `repro` — the distinct states of the agent's tests are checked in the order they appeared
      (the same check as the verifier's, cached, so the final state costs nothing more), up to the
      first that meets it, at most `MAX_TRACKED_CHECKS`: its first turn is the sub-step's;
    * `tests` (the fix) — when the verdict passed it, the turn from which the code (the diff without
      the agent's tests) stayed as it was judged. Only the final code is judged, so this is the turn
      the passing code was in place for good (a fix met earlier and then edited counts from the edit).
    """

    def __init__(self, task: Task):
        from tryloop.rewards.verifier import split_changes

        self.task = task
        self.decl = task.meta.substeps
        self._split = split_changes
        self.pristine = task.workspace_files()
        self.hidden = task.hidden_tests()
        self.states: list[tuple[int, str | None, str | None]] = []   # (turn, tests digest, code digest)
        self.tests_at: dict[str, dict[str, bytes]] = {}
        self.first_met: dict[str, int | None] = {f"step:{s.name}": None for s in self.decl.steps}
        self.error = ""

    @classmethod
    def for_task(cls, task: Task) -> CodeStepTracker | None:
        decl = task.meta.substeps
        if decl is None or not decl.track or task.meta.grader != "tests":
            return None
        try:
            validate_substeps(task)
        except SubStepError:
            return None   # the verifier says what is wrong with the declaration
        return cls(task)

    async def after_turn(self, turn: int, sb: Any) -> None:
        from tryloop.agent.workspace import workspace_changes

        try:
            changes, _ = await workspace_changes(sb, self.pristine)
        except (SandboxError, OSError) as e:
            self.states.append((turn, None, None))
            self.error = f"turn {turn}: {e}"
            return
        applied, _ = self._split(self.task, changes, self.hidden)
        tests = agent_tests(applied)
        code = {p: d for p, d in applied.items() if p not in tests}
        t = digest(tests) if tests else None
        if t is not None:
            self.tests_at.setdefault(t, tests)
        self.states.append((turn, t, digest(code)))

    async def finish(self, runtime: SandboxRuntime, verdict: Any) -> None:
        judged = verdict.meta.get("substeps") or {}
        for s in self.decl.steps:
            key = f"step:{s.name}"
            if s.check == TESTS and judged.get(key) == "passed" and self.states:
                final, turn = self.states[-1][2], None
                for t, _, code in reversed(self.states):
                    if code != final:
                        break
                    turn = t
                self.first_met[key] = turn
            elif s.check == REPRO:   # an earlier state of the tests may have met it even if the final does not
                await self._first_repro(runtime, key)

    async def _first_repro(self, runtime: SandboxRuntime, key: str) -> None:
        seen: set[str] = set()
        for turn, t, _ in self.states:
            if t is None or t in seen:
                continue
            if len(seen) >= MAX_TRACKED_CHECKS:
                self.error = self.error or f"stopped after {MAX_TRACKED_CHECKS} states of the agent's tests"
                return
            seen.add(t)
            try:
                rep = await check_repro(runtime, self.task, self.tests_at[t], runs=self.decl.repro_runs)
            except (SandboxError, harness.HarnessError, OSError, TimeoutError) as e:
                self.error = f"repro check of turn {turn}: {type(e).__name__}: {e}"
                return
            if rep.met:
                self.first_met[key] = turn
                return

