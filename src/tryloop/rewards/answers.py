"""Answer grading: the verifier's path for answer-graded tasks (data analysis, structured documents).

Nothing of the agent's runs here: the verifier takes the answer file from the
agent's final files (the episode's diff), parses it as JSON (size-capped) and
compares it on the host with a gold value that is

* recomputed, for a data task, from the pristine workspace (the task's own
  files, not the agent's) with the reference query of `tests/check.json`;
* the gold record of `tests/check.json`, for a document task, after the
  answer has satisfied the task's JSON Schema (jsonschema, Draft 2020-12).

The check never enters a sandbox, so no code of the agent can read it.
Each sub-step (data) or field (documents) becomes one entry of
`Verdict.outcomes` ("step:<name>", "field:<path>", "schema"); the task passes
when every one passed, and the `tests` component of the reward spec is 1.0 then
(with `partial_credit`: the weighted fraction met).
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tryloop.tasks.families.check import (
    DataCheck,
    DocumentCheck,
    FieldRule,
    ServiceCheck,
    Step,
    load_check,
)
from tryloop.tasks.families.tables import iso_date, num, reference_db, run_query
from tryloop.tasks.model import Task

MAX_ANSWER_BYTES = 1 << 20
PASSED, FAILED = "passed", "failed"


@dataclass
class Graded:
    """The comparison of one answer file with the gold."""

    outcomes: dict[str, str] = field(default_factory=dict)   # step:/field:/schema -> passed | failed
    scores: dict[str, float] = field(default_factory=dict)   # same keys, in [0, 1]
    weights: dict[str, float] = field(default_factory=dict)
    reason: str = ""

    @property
    def passed(self) -> bool:
        return bool(self.outcomes) and all(o == PASSED for o in self.outcomes.values())

    @property
    def score(self) -> float:
        total = sum(self.weights.values())
        return sum(self.weights[k] * self.scores.get(k, 0.0) for k in self.weights) / total if total else 0.0


# ---- reading the answer -----------------------------------------------------

def read_answer(final: dict[str, bytes], path: str) -> tuple[Any, str]:
    """(parsed JSON, "") or (None, why not)."""
    data = final.get(path)
    if data is None:
        return None, f"no {path} in the final workspace"
    if len(data) > MAX_ANSWER_BYTES:
        return None, f"{path} is larger than {MAX_ANSWER_BYTES} bytes"
    try:
        return json.loads(data, parse_constant=_no_constant), ""
    except (ValueError, RecursionError) as e:
        return None, f"{path} is not valid JSON: {e}"


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


# ---- data: typed values with tolerances ---------------------------------------

def _text(v: Any) -> str:
    s = unicodedata.normalize("NFKC", str(v)).casefold()
    return " ".join(s.split()).strip(" .")


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _num_eq(got: Any, gold: float, step: Step) -> bool:
    return _is_num(got) and abs(got - gold) <= max(step.abs_tol, step.rel_tol * abs(gold))


def _cell_eq(got: Any, gold: Any, step: Step) -> bool:
    if _is_num(gold):
        return _num_eq(got, gold, step)
    if gold is None:
        return got is None
    return not _is_num(got) and got is not None and _text(got) == _text(gold)


def _multiset_eq(got: list, gold: list, eq: Callable[[Any, Any], bool]) -> bool:
    """Every gold item matched by a distinct answer item, nothing left over (greedy is exact
    here: two gold items an answer item could both match are equal within the tolerance)."""
    if len(got) != len(gold):
        return False
    left = list(got)
    for g in gold:
        i = next((i for i, a in enumerate(left) if eq(a, g)), None)
        if i is None:
            return False
        left.pop(i)
    return True


def gold_value(step: Step, rows: list[tuple]) -> Any:
    """The reference query's rows as the step's type."""
    if step.type in ("number", "string"):
        if len(rows) != 1 or len(rows[0]) != 1:
            raise ValueError(f"step {step.name}: a {step.type} needs one row of one column, got {len(rows)} row(s)")
        v = rows[0][0]
        if step.type == "number":
            if not _is_num(v):
                raise ValueError(f"step {step.name}: the reference gives {v!r}, not a number")
            return v
        return None if v is None else str(v)
    if step.type == "list":
        return [r[0] for r in rows]
    return [list(r) for r in rows]


def compare(step: Step, got: Any, gold: Any) -> bool:
    if step.type == "number":
        return _num_eq(got, gold, step)
    if step.type == "string":
        return isinstance(got, str) and gold is not None and _text(got) == _text(gold)
    if not isinstance(got, list):
        return False
    if step.type == "list":
        eq = lambda a, g: _cell_eq(a, g, step)  # noqa: E731
    else:
        if not all(isinstance(r, list) for r in got):
            return False
        eq = lambda a, g: len(a) == len(g) and all(_cell_eq(x, y, step) for x, y in zip(a, g, strict=True))  # noqa: E731
    if step.ordered:
        return len(got) == len(gold) and all(eq(a, g) for a, g in zip(got, gold, strict=True))
    return _multiset_eq(got, gold, eq)


def data_gold(check: DataCheck, pristine: dict[str, bytes]) -> dict[str, Any]:
    """Every step's gold value, recomputed from the pristine data files."""
    conn = reference_db(pristine)
    try:
        return {s.name: gold_value(s, run_query(conn, s.sql)) for s in check.steps}
    finally:
        conn.close()


def grade_data(check: DataCheck, answer: Any, gold: dict[str, Any]) -> Graded:
    g = Graded()
    for step in check.steps:
        key = f"step:{step.name}"
        ok = isinstance(answer, dict) and step.name in answer and compare(step, answer[step.name], gold[step.name])
        g.outcomes[key], g.scores[key], g.weights[key] = (PASSED if ok else FAILED), float(ok), step.weight
    missed = [s.name for s in check.steps if g.outcomes[f"step:{s.name}"] != PASSED]
    g.reason = f"wrong or missing: {', '.join(missed)}" if missed else ""
    return g


# ---- documents: schema first, then fields ---------------------------------------

def _get(doc: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(doc, dict) or part not in doc:
            return None
        doc = doc[part]
    return doc


_PUNCT = re.compile(r"[^\w\s]")


def _field_eq(kind: str, got: Any, gold: Any, rel_tol: float = 0.005) -> bool:
    if gold is None:
        return got is None
    if kind == "exact":
        return isinstance(got, str | int) and not isinstance(got, bool) and str(got).strip() == str(gold)
    if kind == "enum":
        return isinstance(got, str) and got.strip().casefold() == str(gold).casefold()
    if kind == "text":
        return isinstance(got, str) and _PUNCT.sub("", _text(got)) == _PUNCT.sub("", _text(gold))
    if kind == "amount":
        g = num(got) if isinstance(got, str) else (got if _is_num(got) else None)
        return g is not None and abs(g - gold) <= max(0.005, rel_tol * abs(gold))
    if kind == "date":
        return isinstance(got, str) and iso_date(got) == gold
    raise ValueError(f"unknown match {kind!r}")


def _f1(got: list, gold: list, eq: Callable[[Any, Any], bool]) -> float:
    if not gold and not got:
        return 1.0
    left, hit = list(got), 0
    for g in gold:
        i = next((i for i, a in enumerate(left) if eq(a, g)), None)
        if i is not None:
            left.pop(i)
            hit += 1
    return 2 * hit / (len(got) + len(gold)) if hit else 0.0


def field_score(rule: FieldRule, got: Any, gold: Any) -> float:
    """1.0 for a match; lists (sets, records) score their F1 against the gold items."""
    if rule.match == "set":
        if not isinstance(got, list):
            return 0.0
        return _f1(got, gold, lambda a, g: isinstance(a, str) and _text(a) == _text(g))
    if rule.match == "records":
        if not isinstance(got, list):
            return 0.0

        def eq(a: Any, g: dict) -> bool:
            return isinstance(a, dict) and all(_field_eq(rule.record_match.get(k, "exact"), a.get(k), g.get(k),
                                                         rule.rel_tol) for k in g)
        return _f1(got, gold, eq)
    return float(_field_eq(rule.match, got, gold, rule.rel_tol))


def grade_document(check: DocumentCheck, answer: Any) -> Graded:
    from jsonschema import Draft202012Validator

    g = Graded()
    errors = sorted(Draft202012Validator(check.json_schema).iter_errors(answer), key=lambda e: list(e.path))
    g.outcomes["schema"] = FAILED if errors else PASSED
    if errors:
        # Schema validity comes first: an invalid document scores nothing, field by field included.
        e = errors[0]
        g.reason = f"not valid against the schema at /{'/'.join(map(str, e.path))}: {e.message}"
        g.weights["schema"], g.scores["schema"] = 1.0, 0.0
        return g
    missed = []
    for rule in check.fields:
        key = f"field:{rule.path}"
        s = field_score(rule, _get(answer, rule.path), _get(check.gold, rule.path))
        g.scores[key], g.weights[key] = s, rule.weight
        g.outcomes[key] = PASSED if s >= 1.0 else FAILED
        if s < 1.0:
            missed.append(rule.path)
    g.reason = f"fields not matching the document: {', '.join(missed)}" if missed else ""
    return g


# ---- one entry point ---------------------------------------------------------------

def grade(task: Task, final: dict[str, bytes], pristine: dict[str, bytes] | None = None,
          gold: dict[str, Any] | None = None) -> Graded:
    """Grade the answer file in `final` (the workspace after the agent). `CheckError` when the
    task's check or data is at fault (the verifier's no-verdict, the gate's rejection).
    Host-only: an operations task needs `grade_changes` (a sandbox)."""
    check = load_check(task)
    if isinstance(check, ServiceCheck):
        raise ValueError(f"task {task.id}: an operations task is graded in a sandbox (grade_changes)")
    answer, why = read_answer(final, check.answer_file)
    if isinstance(check, DataCheck):
        gold = gold if gold is not None else data_gold(check, pristine if pristine is not None
                                                       else task.workspace_files())
        if why:
            g = grade_data(check, None, gold)
            g.reason = why
            return g
        return grade_data(check, answer, gold)
    if why:
        return Graded({"schema": FAILED}, {"schema": 0.0}, {"schema": 1.0}, why)
    return grade_document(check, answer)


async def grade_changes(runtime: Any, task: Task, changes: dict[str, bytes | None],
                        pristine: dict[str, bytes] | None = None, gold: dict[str, Any] | None = None) -> Graded:
    """Grade the agent's diff: on the host (data, documents), or for an operations task by its end
    state in a fresh sandbox (tryloop.rewards.service) plus the root cause it names."""
    from tryloop.rewards.service import root_cause, service_outcomes

    pristine = pristine if pristine is not None else task.workspace_files()
    final = {**pristine, **{p: d for p, d in changes.items() if d is not None}}
    for p, d in changes.items():
        if d is None:
            final.pop(p, None)
    check = load_check(task)
    if not isinstance(check, ServiceCheck):
        return grade(task, final, pristine, gold)
    answer, why = read_answer(final, check.answer_file)
    named = root_cause(check, answer)
    outcomes, reason = await service_outcomes(runtime, task, check, changes)
    g = Graded()
    for key, ok in (("root_cause", named), *((k, v == PASSED) for k, v in outcomes.items())):
        g.outcomes[f"step:{key}"], g.scores[f"step:{key}"], g.weights[f"step:{key}"] = \
            (PASSED if ok else FAILED), float(ok), 1.0
    g.reason = "; ".join(x for x in (why or ("" if named else "wrong root cause"), reason) if x)
    return g


class StepTracker:
    """The turn at which each sub-step (or field) was first met, for a task whose check asks for it
    (`track`). After each turn the episode hands over the answer file's bytes; the gold is computed
    once. The verifier's verdict still decides; this only records progress along the way."""

    def __init__(self, task: Task):
        self.task = task
        self.check = load_check(task)
        self.gold = data_gold(self.check, task.workspace_files()) if isinstance(self.check, DataCheck) else None
        self.first_met: dict[str, int | None] = {}

    @classmethod
    def for_task(cls, task: Task) -> StepTracker | None:
        from tryloop.tasks.families.check import CheckError

        if task.meta.grader != "answer":
            return None
        try:
            tracker = cls(task)
        except CheckError:
            return None   # the verifier will say what is wrong with the check
        return tracker if tracker.check.track and not isinstance(tracker.check, ServiceCheck) else None

    @property
    def answer_file(self) -> str:
        return self.check.answer_file

    async def after_turn(self, turn: int, sb: Any) -> None:
        """The episode's hook after each turn: read the answer file from the agent's sandbox."""
        from tryloop.errors import SandboxError

        try:
            answer = sb.read_file(self.answer_file, max_bytes=MAX_ANSWER_BYTES)
        except (FileNotFoundError, IsADirectoryError, OSError, SandboxError):
            answer = None
        self.observe(turn, answer)

    async def finish(self, runtime: Any, verdict: Any) -> None:
        """The episode's hook after the verdict: nothing left to do (each turn was graded)."""

    def observe(self, turn: int, answer: bytes | None) -> None:
        g = grade(self.task, {} if answer is None else {self.check.answer_file: answer}, {}, self.gold)
        for key, outcome in g.outcomes.items():
            if outcome == PASSED and self.first_met.get(key) is None:
                self.first_met[key] = turn
            else:
                self.first_met.setdefault(key, None)


async def judge_answer(runtime: Any, task: Task, sub: Any, spec: Any, verdict: Any) -> None:
    """The verifier's `_judge` for answer-graded tasks: detectors, the answer grade, components."""
    from tryloop.rewards import rules
    from tryloop.rewards.detectors import detect
    from tryloop.rewards.verifier import VerifierError, _apply_flag_policy
    from tryloop.tasks.families.check import CheckError

    pristine = task.workspace_files()
    verdict.flags = list(detect(task, sub, pristine=pristine, hidden_tests={}))
    try:
        g = await grade_changes(runtime, task, sub.changes, pristine)
    except CheckError as e:  # the task's fault, not the agent's: no score
        raise VerifierError(str(e)) from None
    verdict.outcomes = dict(g.outcomes)
    verdict.meta.update(answer_scores=g.scores, answer_score=round(g.score, 6))
    state = "pass" if g.passed else "fail"
    comps = await rules.components(task, sub, spec, pristine=pristine, tests_passed=0, tests_expected=0,
                                   tests_state=state)
    for c in spec.components:
        if c.kind == "tests":  # the answer's weighted fraction met, with partial credit
            comps[c.name] = g.score if spec.partial_credit else float(g.passed)
    verdict.components = comps
    total_w = sum(g.weights.values())
    if total_w:   # each sub-step's part of the tests component (per-turn credit in training)
        w = sum(c.weight for c in spec.components if c.kind == "tests")
        earned = (lambda k: g.scores.get(k, 0.0)) if spec.partial_credit else (lambda k: float(g.passed))
        verdict.meta["substep_rewards"] = {k: w * g.weights[k] * earned(k) / total_w for k in g.weights}
    total = spec.total(comps)
    if spec.gate_on_tests and state != "pass":
        total = sum(c.weight * comps.get(c.name, 0.0) for c in spec.components
                    if c.kind in ("tests", *rules.PENALTIES))
    verdict.state, verdict.reason = state, g.reason
    _apply_flag_policy(spec, verdict, total)
