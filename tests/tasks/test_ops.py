"""Operations tasks: a broken service with planted faults, gated and judged by end state in fresh
sandboxes (the service started, its health check, a fresh probe job, the backlog) plus the root cause."""

from __future__ import annotations

import asyncio
import json

from tryloop.rewards.answers import grade_changes
from tryloop.rewards.submission import Submission
from tryloop.rewards.verifier import verify
from tryloop.tasks.families import synthesize
from tryloop.tasks.families.gate import validate_answer
from tryloop.tasks.families.ops import LABELS, PROTECTED
from tryloop.tasks.gate import BROKEN_PASSES, GateConfig
from tryloop.tasks.model import Task


def test_faults_are_planted_reproducibly_and_the_instruction_is_the_symptom(tmp_path):
    a = synthesize("ops", tmp_path / "a", per_family=1)
    b = synthesize("ops", tmp_path / "b", per_family=1)
    assert [t.fingerprint() for t in a] == [t.fingerprint() for t in b] and len(a) == 14
    assert {t.meta.tier for t in a} == {"easy", "medium", "hard"}
    for t in a:
        labels = json.loads(t.check_path.read_text())["labels"]
        assert set(labels) <= set(LABELS) and t.meta.origin["faults"] == labels or sorted(t.meta.origin["faults"])
        text = t.instruction.split("Then write")[0]
        assert not any(label in text for label in labels), t.id         # the symptom, never the cause's label
        assert all(p not in t.solution_files() for p in PROTECTED)        # the fix never touches the code
        assert "FATAL" in t.instruction if t.meta.tier == "easy" else "FATAL" not in t.instruction


def test_the_gate_accepts_every_fault_plan(runtime, tmp_path):
    tasks = synthesize("ops", tmp_path, per_family=1)

    async def gate_all():   # at once, as the factory gates
        return await asyncio.gather(*(validate_answer(runtime, t, GateConfig(k=1)) for t in tasks))

    results = asyncio.run(gate_all())
    assert all(r.accepted for r in results), [(r.task_id, r.reason, r.detail) for r in results if not r.accepted]
    assert all(set(r.fail_to_pass) == {"step:root_cause", "step:healthy", "step:probe", "step:backlog"}
               for r in results)


async def test_sub_steps_are_judged_separately(runtime, tmp_path):
    t = synthesize("ops", tmp_path, per_family=1, count=1)[0]
    fix = {p: d for p, d in t.solution_files().items() if p != "answer.json"}
    g = await grade_changes(runtime, t, fix)
    assert g.outcomes == {"step:root_cause": "failed", "step:healthy": "passed", "step:probe": "passed",
                          "step:backlog": "passed"} and "answer.json" in g.reason
    v = await verify(runtime, t, Submission(changes=dict(t.solution_files())))
    assert v.state == "pass" and v.reward == 1.0, v.reason
    v = await verify(runtime, t, Submission.from_files({"answer.json": t.solution_files()["answer.json"]}))
    assert v.state == "fail" and v.outcomes["step:root_cause"] == "passed" and v.outcomes["step:healthy"] == "failed"


def test_a_task_whose_fault_does_not_break_the_service_is_rejected(runtime, tmp_path):
    import shutil

    t = synthesize("ops", tmp_path / "a", per_family=1, count=1)[0]
    shutil.copytree(t.root, tmp_path / "b")
    t = Task.load(tmp_path / "b")
    for path, data in t.solution_files().items():   # "plant" nothing: the workspace is already healthy
        if path != "answer.json":
            (t.workspace_dir / path).write_bytes(data)
    r = asyncio.run(validate_answer(runtime, Task.load(t.root), GateConfig(k=1)))
    assert not r.accepted and r.reason == BROKEN_PASSES and "healthy" in r.detail, r


async def test_restoring_the_code_is_what_stops_a_stub_service(runtime, tmp_path, monkeypatch):
    from tryloop.rewards import service
    from tryloop.rewards.answer_redteam import ANSWER_ATTACKS

    t = synthesize("ops", tmp_path / "w", per_family=1, count=4)[3]  # wrong_env
    sub = ANSWER_ATTACKS["stub_service"](t)
    v = await verify(runtime, t, sub)
    assert v.state == "fail" and v.outcomes["step:healthy"] == "failed"
    assert any(f.kind == "protected_path_edit" for f in v.flags)
    # the same stub, were the code not restored, would answer and convert right: the attack is real
    monkeypatch.setattr(service, "_protected", lambda path, check: False)
    g = await grade_changes(runtime, t, sub.changes)
    assert g.passed, g.outcomes
