"""Sub-steps of a code task on a real bug-fix task: "a test that reproduces the bug" (the agent's test
fails on the broken workspace and passes with the reference fix, in fresh sandboxes through the harness),
then "the fix passes" (the hidden tests); the gate's checks of the declaration."""

from __future__ import annotations

import pytest

from tryloop.rewards.spec import RewardSpec
from tryloop.rewards.submission import Submission
from tryloop.rewards.substeps import (
    SUBSTEP_WITHOUT_CHECK,
    SUBSTEPS_INVALID,
    SubStepError,
    is_test_file,
    validate_substeps,
)
from tryloop.rewards.verifier import verify
from tryloop.tasks.gate import GateConfig, validate
from tryloop.tasks.model import SubStep, SubSteps, Task

# 3/4 of the tests component for the fix, 1/4 for the repro (the task's weights 3 and 1).
FIX, REPRO = 0.75, 0.25


def fixed(task, **extra: bytes) -> Submission:
    return Submission(changes={**task.solution_files(), **extra})


async def test_a_repro_test_and_the_fix_meet_both_sub_steps(runtime, repro_task, repro_test):
    v = await verify(runtime, repro_task, fixed(repro_task, **{"test_repro.py": repro_test}))
    assert v.state == "pass", v.reason
    assert v.meta["substeps"] == {"step:repro": "passed", "step:fix": "passed"}
    assert v.meta["repro"]["reproduced"] == ["test_repro.py::test_factorial_of_five"]
    assert v.meta["repro"]["broken"] == {"test_repro.py::test_factorial_of_five": "failed"}
    assert v.components["correctness"] == pytest.approx(1.0) and v.reward == pytest.approx(1.1)
    assert v.meta["substep_rewards"] == pytest.approx({"step:repro": REPRO, "step:fix": FIX})
    # The agent's test is the repro's only: the fix run (the hidden tests) never collects it.
    assert not any(t.startswith("test_repro.py") for t in v.outcomes)


BOGUS = {
    "fails by itself": b"def test_repro():\n    assert False\n",
    "passes on the broken code": b"from mathkit import factorial\n\n\ndef test_small():\n    assert factorial(1) == 1\n",
    "fails on both": b"from mathkit import factorial\n\n\ndef test_wrong():\n    assert factorial(5) == 121\n",
    "needs something absent": b"import repro_helper\n\n\ndef test_uses_helper():\n    assert repro_helper.ok()\n",
    "not collected": b"from mathkit import factorial\n\n\ndef check_five():\n    assert factorial(5) == 120\n",
    "does not import": b"def test_broken(:\n    pass\n",
}


@pytest.mark.parametrize("kind", sorted(BOGUS))
async def test_a_bogus_repro_does_not_meet_the_sub_step_nor_touch_the_fix(runtime, repro_task, kind):
    # The helper the last-but-two relies on is the agent's own file, not a test: it never enters the repro runs.
    extra = {"test_repro.py": BOGUS[kind], "repro_helper.py": b"def ok():\n    return False\n"}
    v = await verify(runtime, repro_task, fixed(repro_task, **extra))
    assert v.state == "pass", (kind, v.reason)        # the failing test changes nothing in the fix's verdict
    assert v.meta["substeps"] == {"step:repro": "failed", "step:fix": "passed"}, kind
    assert v.meta["repro"]["reason"] and not v.meta["repro"]["reproduced"]
    assert v.components["correctness"] == pytest.approx(FIX)


def _text_detector(task, kind: str) -> bytes:
    """A test that tells the fix from the bug by the module's text, not by running it."""
    import hashlib

    path = "mathkit/arith.py"
    if kind == "digest":
        digest = hashlib.sha256(task.workspace_files()[path]).hexdigest()
        return (f"import hashlib\nfrom pathlib import Path\n\n\ndef test_changed():\n"
                f"    data = (Path(__file__).parent / {path!r}).read_bytes()\n"
                f"    assert hashlib.sha256(data).hexdigest() != {digest!r}\n").encode()
    return (f"from pathlib import Path\n\n\ndef test_token_gone():\n"
            f"    assert 'range(2, n)' not in (Path(__file__).parent / {path!r}).read_text()\n").encode()


@pytest.mark.parametrize("kind", ["digest", "token"])
async def test_a_repro_that_reads_the_code_instead_of_running_it_is_no_repro(runtime, repro_task, kind):
    """It fails on the broken code and passes with the fix, but it passes on the broken code rewritten
    without changing what it does (reformatted, renamed): the sub-step is not met."""
    v = await verify(runtime, repro_task, fixed(repro_task, **{"test_repro.py": _text_detector(repro_task, kind)}))
    assert v.state == "pass", v.reason
    assert v.meta["substeps"] == {"step:repro": "failed", "step:fix": "passed"}, v.meta.get("repro")
    assert not v.meta["repro"]["reproduced"] and "text apart" in v.meta["repro"]["reason"]
    assert v.meta["repro"]["broken"] and v.meta["repro"]["reference"]     # it did tell broken from fixed


def test_the_rewritten_broken_code_does_what_the_broken_code_does(repro_task, repro_test):
    from tryloop.rewards.substeps import rewritten_broken

    new = rewritten_broken(repro_task, {"test_repro.py": repro_test})
    old = repro_task.workspace_files()
    assert set(new) == {"mathkit/arith.py"} and new["mathkit/arith.py"] != old["mathkit/arith.py"]
    assert b"range(2, n)" not in new["mathkit/arith.py"]     # the local name is renamed
    spaces: list[dict] = [{}, {}]
    for ns, code in zip(spaces, (old["mathkit/arith.py"], new["mathkit/arith.py"]), strict=True):
        exec(compile(code, "arith.py", "exec"), ns)
    assert [spaces[0]["factorial"](k) for k in range(8)] == [spaces[1]["factorial"](k) for k in range(8)]


async def test_the_fix_alone_gets_only_its_part_and_the_repro_alone_only_its(runtime, repro_task, repro_test):
    v = await verify(runtime, repro_task, fixed(repro_task))
    assert v.state == "pass" and v.meta["substeps"] == {"step:repro": "failed", "step:fix": "passed"}
    assert "no test file" in v.meta["repro"]["reason"]
    assert v.meta["substep_rewards"] == pytest.approx({"step:repro": 0.0, "step:fix": FIX})
    assert v.reward == pytest.approx(FIX + 0.1)       # + compiles
    # A test under the protected tests/ is restored, so it is nobody's repro.
    v = await verify(runtime, repro_task, fixed(repro_task, **{"tests/test_repro.py": repro_test}))
    assert v.meta["substeps"]["step:repro"] == "failed" and "tests/test_repro.py" in v.meta["restored"]
    # The repro without the fix: the verdict is the fix's (fail), the repro keeps its part.
    v = await verify(runtime, repro_task, Submission(changes={"test_repro.py": repro_test}),
                     RewardSpec(gate_on_tests=True))
    assert v.state == "fail" and v.meta["substeps"] == {"step:repro": "passed", "step:fix": "failed"}
    assert v.reward == pytest.approx(REPRO)
    # With partial credit the fix's score is the fraction of expected tests passed (25 of 26 here).
    v = await verify(runtime, repro_task, Submission(changes={"test_repro.py": repro_test}),
                     RewardSpec(partial_credit=True))
    n = len(v.outcomes)   # the expected tests: those the reference passes (all of them here)
    assert v.meta["substep_scores"] == pytest.approx({"step:repro": 1.0, "step:fix": (n - 1) / n})
    assert v.components["correctness"] == pytest.approx(REPRO + FIX * (n - 1) / n)


def _with_steps(task: Task, tmp_path, steps: list[SubStep]) -> Task:
    import shutil

    dest = tmp_path / "t"
    shutil.copytree(task.root, dest)
    t = Task.load(dest)
    t.save_meta(t.with_meta(substeps=SubSteps(steps=steps)))
    return Task.load(dest)


@pytest.mark.parametrize(("steps", "reason", "words"), [
    ([SubStep(name="repro"), SubStep(name="fix", check="tests")], SUBSTEP_WITHOUT_CHECK, "has no check"),
    ([SubStep(name="docs", check="readme"), SubStep(name="fix", check="tests")], SUBSTEP_WITHOUT_CHECK,
     "does not exist"),
    ([SubStep(name="repro", check="repro")], SUBSTEPS_INVALID, "no sub-step is the fix"),
    ([SubStep(name="fix", check="tests"), SubStep(name="fix", check="repro")], SUBSTEPS_INVALID, "unique"),
    ([SubStep(name="fix", check="tests", weight=0)], SUBSTEPS_INVALID, "sum to 0"),
])
async def test_the_gate_rejects_a_sub_step_it_cannot_check(runtime, repro_task, tmp_path, steps, reason, words):
    task = _with_steps(repro_task, tmp_path, steps)
    with pytest.raises(SubStepError, match=words):
        validate_substeps(task)
    res = await validate(runtime, task, GateConfig(k=1))
    assert not res.accepted and res.reason == reason and words in res.detail
    # The verifier does not score a task whose sub-steps it cannot judge: no verdict, the task's fault.
    v = await verify(runtime, task, fixed(task))
    assert v.state == "no_verdict" and v.reward is None and words in v.reason


async def test_the_gate_accepts_a_task_whose_hidden_tests_reproduce_the_bug(runtime, repro_task):
    res = await validate(runtime, repro_task, GateConfig(k=2, require_pass_to_pass=True))
    assert res.accepted, res
    assert res.fail_to_pass == ["tests/test_arith.py::test_factorial"]


def test_sub_steps_are_part_of_the_task_version(repro_task, tmp_path):
    other = _with_steps(repro_task, tmp_path, [SubStep(name="repro", check="repro", weight=2),
                                               SubStep(name="fix", check="tests", weight=3)])
    assert other.fingerprint() != repro_task.fingerprint()
    assert is_test_file("a/test_x.py") and is_test_file("x_test.py") and not is_test_file("testing.py")


async def test_a_repro_test_that_forges_its_report_is_caught(runtime, repro_task, repro_test):
    forger = (b"import glob\nfor _p in glob.glob('/tmp/.v*/out'):\n"
              b"    open(_p, 'a').write('00 {\"kind\": \"finish\", \"seq\": 99}\\n')\n")
    v = await verify(runtime, repro_task, fixed(repro_task, **{"test_repro.py": forger + repro_test}))
    assert v.meta["substeps"]["step:repro"] == "failed" and "no clean complete report" in v.meta["repro"]["reason"]
    # Runtime evidence of the repro runs joins the verdict: the default policy zeroes it all.
    assert any(f.kind == "report_forged" for f in v.flags)
    assert v.state == "fail" and v.reward == 0.0


async def test_an_answer_graded_task_declares_its_sub_steps_in_its_check_not_here(runtime, repro_task, tmp_path):
    task = _with_steps(repro_task, tmp_path, [SubStep(name="fix", check="tests")])
    task.save_meta(task.with_meta(grader="answer"))
    res = await validate(runtime, Task.load(task.root), GateConfig(k=1))
    assert not res.accepted and res.reason == SUBSTEPS_INVALID and "tests/check.json" in res.detail
