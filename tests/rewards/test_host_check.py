"""Function tasks judged on the host, in real sandboxes: the probe carries only inputs, the host
compares the outputs, and what fools an in-process comparison fools nothing here."""

from __future__ import annotations

import ast

import pytest

from tryloop.rewards.host_check import PROBE_TEST, host_check
from tryloop.rewards.redteam import constant_eq, patch_pytest_reports
from tryloop.rewards.submission import Submission
from tryloop.rewards.verifier import verify
from tryloop.tasks.sources.functions import TEST_FILE, function_tasks


@pytest.fixture(scope="module")
def fn_task(tmp_path_factory):
    return function_tasks(tmp_path_factory.mktemp("fn"), per_family=1, families=["add-constant"])[0]


def test_the_probe_carries_the_inputs_and_none_of_the_expected_values(fn_task):
    check = host_check(fn_task)
    assert check is not None and check.function and len(check.inputs) == len(check.expected) >= 4
    probe = check.hidden()[TEST_FILE].decode()
    assert "CASES" in fn_task.hidden_tests()[TEST_FILE].decode() and "CASES" not in probe
    for args in check.inputs:
        assert repr(args) in probe
    # The probe's only numbers are the inputs (add-constant: ints): no expected value, no k.
    numbers = sorted(abs(n.value) for n in ast.walk(ast.parse(probe))
                     if isinstance(n, ast.Constant) and isinstance(n.value, int))
    assert numbers == sorted(abs(a) for args in check.inputs for a in args)


async def test_outputs_are_compared_on_the_host(runtime, fn_task):
    ok = await verify(runtime, fn_task, Submission(changes=dict(fn_task.solution_files())))
    assert ok.state == "pass" and ok.meta["host_check"], ok.reason
    assert set(ok.outcomes) == {f"{TEST_FILE}::{PROBE_TEST}[{i}]" for i in range(len(host_check(fn_task).inputs))}
    src = fn_task.solution_files()["solution.py"].decode()
    off_by_one = Submission.from_files({"solution.py": src.replace("return ", "return 1 + ", 1)})
    bad = await verify(runtime, fn_task, off_by_one)
    assert bad.state == "fail" and set(bad.outcomes.values()) == {"failed"}, bad.outcomes


@pytest.mark.parametrize("attack", [constant_eq, patch_pytest_reports])
async def test_in_process_tricks_do_not_pass_a_host_comparison(runtime, fn_task, attack):
    # An object equal to anything serializes to what it is; a patched pytest report changes a
    # probe's outcome, not the output the host compares. Both fail the tests themselves.
    # (On a pytest-judged task `patch_pytest_reports` passes every test: FOOLS_TESTS.)
    v = await verify(runtime, fn_task, attack(fn_task))
    assert v.state == "fail" and v.outcomes and set(v.outcomes.values()) == {"failed"}, v.outcomes


def test_an_output_line_nested_too_deep_is_no_answer(fn_task):
    """Code under test can append to the outputs the probe writes; a line nested deeper than
    the JSON parser goes (RecursionError) counts as no answer: the test fails, the verdict
    stands (it was a verifier crash, no verdict, so a failing episode went unjudged)."""
    from tryloop.tasks.harness import RunRecord

    check = host_check(fn_task)
    deep = "[0, " + "[" * 200_000 + "]" * 200_000 + "]"
    first = check.test_id(0)
    run = RunRecord(outcomes={first: "passed"}, read_back=(deep + "\n").encode())
    check.judge(run)
    assert run.outcomes[first] == "failed"
