"""The verifier on real tasks: real pytest in fresh sandboxes, protected paths restored,
authenticated per-test records, three-state verdicts."""

from __future__ import annotations

import pytest

from tryloop.rewards.spec import Component, RewardSpec
from tryloop.rewards.submission import Submission
from tryloop.rewards.verifier import baseline, is_protected, split_changes, verify


def module_under_test(task) -> str:
    return next(p for p in task.solution_files() if p.endswith(".py"))


def with_solution(task, **extra) -> Submission:
    files = {k: v for k, v in task.solution_files().items()}
    files.update({k: v.encode() if isinstance(v, str) else v for k, v in extra.items()})
    return Submission(changes=files)


async def test_reference_passes_and_do_nothing_fails(runtime, task):
    ok = await verify(runtime, task, Submission(changes=dict(task.solution_files())))
    assert ok.state == "pass" and ok.reward == pytest.approx(1.1), ok.reason  # tests 1.0 + compiles 0.1
    assert ok.outcomes and all(o == "passed" for o in ok.outcomes.values())
    assert ok.version and ok.meta["spec_version"] and ok.task_fingerprint == task.fingerprint()
    nothing = await verify(runtime, task, Submission())
    assert nothing.state == "fail" and nothing.reward == 0.0
    assert "expected test(s) not passed" in nothing.reason


async def test_protected_paths_are_restored_before_the_tests_run(runtime, task):
    test_file = next(iter(task.hidden_tests()))
    hook = ("import pytest\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
            "    out = yield\n    out.get_result().outcome = 'passed'\n")
    sub = Submission(changes={"conftest.py": hook.encode(), "sub/conftest.py": hook.encode(),
                              test_file: b"def test_nothing():\n    assert True\n",
                              "pytest.ini": b"[pytest]\naddopts = -p no:python\n"})
    v = await verify(runtime, task, sub)
    assert v.state == "fail"
    assert set(v.meta["restored"]) == {"conftest.py", "sub/conftest.py", test_file, "pytest.ini"}


async def test_code_that_forges_the_report_is_caught(runtime, task):
    forger = (b"import glob\nfor _p in glob.glob('/tmp/.v*/out'):\n"
              b"    open(_p, 'a').write('00 {\"kind\": \"finish\", \"seq\": 99}\\n')\n")
    path = module_under_test(task)
    sub = with_solution(task, **{path: forger + task.solution_files()[path]})
    v = await verify(runtime, task, sub)
    assert v.state == "fail" and "tampered" in v.reason
    assert any(f.kind == "report_forged" for f in v.flags)


async def test_ending_the_process_early_is_not_a_pass(runtime, task):
    path = module_under_test(task)
    for stopper in (b"import os\nos._exit(0)\n", b"import sys\nsys.exit(0)\n"):
        v = await verify(runtime, task, with_solution(task, **{path: stopper + task.solution_files()[path]}))
        assert v.state == "fail", (stopper, v.reason)


async def test_a_hanging_solution_fails_and_a_slow_verifier_is_no_verdict(runtime, task):
    path = module_under_test(task)
    hang = with_solution(task, **{path: b"while True:\n    pass\n"})
    # A limit over three times the reference run (as measured here, on a machine as busy as it is
    # now): the verifier then blames a run that hits it on the solution, not on itself.
    limit = max(5.0, 4 * (await baseline(runtime, task)).wall_s)
    v = await verify(runtime, task, hang, RewardSpec(timeout_s=limit))
    assert v.state == "fail" and "timed out" in v.reason
    # A limit too tight for even the reference: the verifier cannot judge, so no score at all.
    v = await verify(runtime, task, with_solution(task), RewardSpec(timeout_s=0.05))
    assert v.state == "no_verdict" and v.reward is None and "verifier fault" in v.reason


async def test_partial_credit_and_components_are_recorded_unweighted(runtime, reward_tasks):
    task = reward_tasks[1]
    spec = RewardSpec(partial_credit=True, gate_on_tests=False, components=[
        Component(name="correctness", kind="tests", weight=1.0),
        Component(name="compiles", kind="compiles", weight=0.2),
        Component(name="contracts", kind="contracts", weight=0.2),
        Component(name="diff", kind="diff_size", weight=0.1, budget=100),
        Component(name="turns", kind="turns", weight=0.1, budget=10)])
    sub = Submission(metrics={"turns": 4})
    v = await verify(runtime, task, sub, spec)
    assert v.state == "fail"
    c = v.components
    assert 0 < c["correctness"] < 1 and c["compiles"] == 0.0 and c["contracts"] == 1.0  # nothing to compile
    assert c["diff"] == 0.0 and c["turns"] == pytest.approx(0.6)
    assert v.reward == pytest.approx(spec.total(c))
    broken = Submission(changes={module_under_test(task): b"def broken(:\n"})
    v2 = await verify(runtime, task, broken, spec)
    assert v2.components["compiles"] == 0.0 and v2.components["contracts"] < 1.0
    assert v2.components["diff"] < 0


async def test_weights_and_policy_are_part_of_the_version(runtime, task):
    a = await verify(runtime, task, Submission(), RewardSpec())
    b = await verify(runtime, task, Submission(), RewardSpec(flag_penalty=0.25))
    c = await verify(runtime, task, Submission(), RewardSpec())
    assert a.version == c.version != b.version


async def test_a_broken_sandbox_is_no_verdict_not_a_zero(runtime, task, monkeypatch):
    from tryloop.errors import SandboxError

    async def refuse(*a, **k):
        raise SandboxError("no sandbox for you")

    monkeypatch.setattr(runtime, "create", refuse)
    v = await verify(runtime, task, Submission(changes=dict(task.solution_files())), RewardSpec(flag_penalty=0.3))
    assert v.state == "no_verdict" and v.reward is None and "no sandbox" in v.reason


def test_protected_patterns_and_escaping_paths(task):
    assert is_protected("tests/test_x.py", ["tests/"]) and is_protected("a/tests/t.py", ["tests/"])
    assert is_protected("pkg/conftest.py", ["conftest.py"]) and is_protected("x/y.pth", ["*.pth"])
    assert not is_protected("pkg/testsuite.py", ["tests/"])
    applied, refused = split_changes(task, {"../evil.py": b"", "/etc/x": b"", "ok.py": b"x"}, {})
    assert list(applied) == ["ok.py"] and "../evil.py" in refused


def test_the_agents_source_is_compiled_without_warnings_in_the_host():
    # The compiles component and the signature check compile the answer in the trainer's process:
    # an invalid escape sequence in it (a SyntaxWarning from Python 3.12, a DeprecationWarning
    # before) must not print there.
    import warnings

    from tryloop.rewards.rules import compiles, public_signatures

    src = b'def f(x):\n    return "a\\ b" + x\n'
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert compiles(Submission.from_files({"solution.py": src})) == 1.0
        assert public_signatures(src, "solution") == {"solution:f": "x"}
    assert not seen, [str(w.message) for w in seen]
