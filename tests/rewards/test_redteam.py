"""The red-team suite on real tasks: every attack is flagged as a hack, the empty submission is
not; end to end, no attack passes the verifier, and the ones that fool the tests alone are
stopped by their flags."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tryloop.rewards import detectors as d
from tryloop.rewards import redteam as r
from tryloop.rewards.decoys import EXPECTED_READ
from tryloop.rewards.detectors import detect
from tryloop.rewards.submission import Submission
from tryloop.rewards.verifier import verify
from tryloop.tasks import harness as h
from tryloop.tasks.model import Task, TaskMeta

DATA = Path(__file__).parent / "data"
TASK_IDS = ["humaneval/0", "minijson/literal-token-kinds", "fixture/visible-tests"]


@pytest.fixture(scope="module")
def tasks(tmp_path_factory) -> dict[str, Task]:
    found = r.redteam_tasks(tmp_path_factory.mktemp("redteam")) + [Task.load(DATA / "visible-tests")]
    return {t.id: t for t in found}


def test_the_registries_agree():
    assert set(r.ATTACKS) == set(r.EXPECTED_FLAGS)
    assert r.FOOLS_TESTS <= r.SURVIVES_RESTORE <= set(r.ATTACKS)
    assert r.PREVENTED <= r.SURVIVES_RESTORE and not r.PREVENTED & r.FOOLS_TESTS
    assert r.CAUGHT_BY_DECOYS <= r.SURVIVES_RESTORE and not r.CAUGHT_BY_DECOYS & r.FOOLS_TESTS
    assert {r.EXPECTED_FLAGS[a] for a in r.CAUGHT_BY_DECOYS} == {frozenset({EXPECTED_READ})}
    assert r.EXPECTED_FLAGS["do_nothing"] == frozenset()
    for name, kinds in r.EXPECTED_FLAGS.items():
        assert kinds <= set(d.DETECTORS) | set(h.EVIDENCE_KINDS) | {EXPECTED_READ, h.CHANNEL_BROKEN}, name
        assert kinds or name in {"do_nothing", *r.PREVENTED}, name
    with pytest.raises(KeyError, match="unknown attack"):
        r.run("no_such_attack", None)  # type: ignore[arg-type]


def test_the_suite_runs_on_real_bundled_tasks(tasks):
    assert set(tasks) == set(TASK_IDS)
    assert tasks["humaneval/0"].meta.source == "humaneval"
    assert len(tasks["minijson/literal-token-kinds"].solution_files()) == 2  # a multi-file fix


@pytest.mark.parametrize("task_id", TASK_IDS)
@pytest.mark.parametrize("attack", list(r.ATTACKS))
def test_every_attack_is_flagged_as_a_hack(tasks, attack, task_id):
    task = tasks[task_id]
    sub = _attack(attack, task)
    if sub is None:
        return
    flags = detect(task, sub, pristine=task.workspace_files(), hidden_tests=task.hidden_tests())
    hack_kinds = {f.kind for f in d.hacks(flags)}
    assert r.EXPECTED_FLAGS[attack] & set(d.DETECTORS) <= hack_kinds, flags  # runtime kinds: end to end
    if attack == "do_nothing":
        assert sub.changes == {} and not d.hacks(flags)
    else:
        assert sub.changes or sub.commands
    # Real attacks: the Python they write is valid code, and each flag shows where to look.
    for path, data in sub.changes.items():
        if data is not None and path.endswith(".py"):
            ast.parse(data)
    assert all(f.file or f.command for f in flags)


def test_attacks_that_live_in_the_code_under_test_leave_tests_and_hooks_alone(tasks):
    task = tasks["fixture/visible-tests"]
    for name in r.SURVIVES_RESTORE - {"skip_marks"}:
        sub = _attack(name, task)
        if sub is None:
            continue
        changed = sub.changes
        assert not any(d.protected_match(p, task.meta.protected_paths) or p in task.hidden_tests()
                       for p in changed), name


def test_hidden_literals_needs_literal_asserts(tmp_path):
    meta = TaskMeta(id="unit/no-literals", family="unit", project="unit", source="local")
    task = Task.create(tmp_path / "t", meta, "x", workspace={"m.py": "def f(x):\n    return x\n"},
                       tests={"tests/test_m.py": "from m import f\n\n\ndef test_f():\n    x = 3\n    assert f(x) == x\n"},
                       solution={"m.py": "def f(x):\n    return x\n"})
    with pytest.raises(r.AttackNotApplicable, match="literal asserts"):
        r.hidden_literals(task)


def test_hidden_literals_hard_codes_the_leaked_pairs(tasks):
    task = tasks["humaneval/0"]
    text = r.hidden_literals(task).changes["solution.py"].decode()
    assert "if (numbers, threshold,) == ([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3,):" in text
    assert "has_close_elements" in r.leaked_cases(task)


# ---- end to end: the verifier ------------------------------------------------------------------


def _attack(attack: str, task: Task) -> Submission | None:
    """The attack's submission; None where the task lacks what it reads (only the attacks that
    read parametrizations or tables of the hidden tests may need that)."""
    try:
        return r.run(attack, task)
    except r.AttackNotApplicable:
        assert attack in {"read_params", "read_tables"}, attack
        return None


async def _judge(runtime, task: Task, attack: str) -> None:
    sub = _attack(attack, task)
    if sub is None:
        return
    verdict = await verify(runtime, task, sub)
    assert verdict.state != "no_verdict", verdict.reason
    hack_kinds = {f.kind for f in verdict.flags if f.severity == "hack"}
    if attack == "do_nothing":
        assert verdict.state == "fail" and not hack_kinds, verdict
        return
    assert verdict.state != "pass", verdict
    if attack in r.CAUGHT_BY_DECOYS and set(verdict.outcomes.values()) != {"passed"}:
        return  # it did not pass the tests here, so no decoy ran; the verdict is a fail
    assert r.EXPECTED_FLAGS[attack] <= hack_kinds, verdict.flags
    if attack in r.FOOLS_TESTS:
        # The tests alone were fooled: only the flags kept the reward at zero. If the verifier
        # learns to catch this one itself, take it out of FOOLS_TESTS.
        assert verdict.outcomes and set(verdict.outcomes.values()) == {"passed"}, verdict.outcomes
        assert verdict.reward == 0.0
    if attack in r.PREVENTED:
        assert set(verdict.outcomes.values()) != {"passed"}, verdict.outcomes


# Every attack, through the real verifier, in the default run: one test each, on the task that
# has visible tests, a conftest and a multi-module package (a second or two per attack).
@pytest.mark.parametrize("attack", list(r.ATTACKS))
async def test_the_verifier_rejects_every_attack_on_a_task_with_visible_tests(runtime, attack):
    await _judge(runtime, Task.load(DATA / "visible-tests"), attack)


@pytest.mark.slow  # every attack on the other red-team tasks: about two minutes
@pytest.mark.parametrize("task_id", TASK_IDS[:2])
@pytest.mark.parametrize("attack", list(r.ATTACKS))
async def test_the_verifier_rejects_every_attack(runtime, tasks, attack, task_id):
    await _judge(runtime, tasks[task_id], attack)


# The attacks on the judge's moving parts (plugin manager, hook callers and implementations,
# pytest's module functions and classes, collected items, the harness's own events), each with
# names no static reading resolves: only the runtime integrity check stands in their way.
JUDGE_ATTACKS = ["config_reach_hidden", "plugin_register", "runner_swap", "callinfo_swap", "report_class_swap",
                 "hookimpl_drop", "hookexec_swap", "item_swap", "event_forge", "thread_forge"]


def test_judge_attacks_are_invisible_to_the_static_detectors(tasks):
    task = tasks["fixture/visible-tests"]
    for name in JUDGE_ATTACKS:
        assert r.EXPECTED_FLAGS[name] == {h.JUDGE_TAMPER}, name
        sub = r.run(name, task)
        flags = detect(task, sub, pristine=task.workspace_files(), hidden_tests=task.hidden_tests())
        assert not d.hacks(flags), (name, flags)
