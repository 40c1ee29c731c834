"""Decoy runs: the hidden tests with their expected values changed. A correct program fails every
armed test there (so it is never flagged); a program whose outputs follow the tests' expected
values, read by any path, still passes and is flagged `expected_read`."""

from __future__ import annotations

import ast
import math
import random
from pathlib import Path

import pytest

from tryloop.rewards import decoys
from tryloop.rewards import redteam as r
from tryloop.rewards.decoys import EXPECTED_READ, make_decoy, mutate
from tryloop.rewards.spec import RewardSpec
from tryloop.rewards.submission import Submission
from tryloop.rewards.verifier import verify
from tryloop.tasks.model import Task

DATA = Path(__file__).parent / "data"


@pytest.mark.parametrize("value", [0, 7, -3, 1.5, 0.25, 1790.0, -40.0, 1e-9, True, False, "", "abc", "12:00",
                                   "  ", b"xy", [], [1, 2], (3.5, "a"), {"k": 1}, {}, {1, 2}, [[1], [2, 3]]])
def test_a_changed_value_has_the_same_type_and_is_unequal(value):
    for seed in range(20):
        new = mutate(value, random.Random(seed))
        assert type(new) is type(value) and new != value, (value, new)
        assert ast.literal_eval(repr(new)) == new


@pytest.mark.parametrize("value", [None, math.nan, math.inf, [None], 1j, ...])
def test_values_without_a_plausible_change_are_left_alone(value):
    assert mutate(value, random.Random(0)) is decoys._SKIP


def _decoy(source: str, seed: int = 0, path: str = "tests/test_m.py") -> decoys.Decoy | None:
    return make_decoy({path: source.encode()}, seed)


def _armed(source: str) -> set[str]:
    found: set[str] = set()
    for seed in range(8):  # which direct assertions change is drawn: arming is the same every time
        d = _decoy(source, seed)
        found |= {q for _, q in d.armed} if d else set()
    return found


def test_what_a_decoy_changes_and_arms():
    source = '''import pytest
import unittest
from m import f, g

ROWS = [((1, 2), 3), ((2, 2), 4)]
INPUTS = [(1, 1), (2, 0)]


def check(candidate):
    assert candidate(1) == [4, 5]


def test_direct():
    assert f(1) == 2
    assert 5 == g(2)


@pytest.mark.parametrize("x, want", [(1, "a"), (2, "b")])
def test_params(x, want):
    assert f(x) == want


def test_table():
    for args, want in ROWS:
        assert g(*args) == want


def test_helper():
    check(f)


class TestThing:
    def test_method(self):
        assert f(3) == 9.5


class Case(unittest.TestCase):
    def test_equal(self):
        self.assertEqual(f(0), (1, 2))


# Not armed: nothing literal, a branch, an early return, a table read as input elsewhere, no
# equality. An expected value that is also an input is not changed.
def test_computed():
    assert f(1) == g(1)


def test_branch():
    if f(0):
        assert f(1) == 2


def test_early_return():
    if g(0):
        return
    assert f(1) == 2


@pytest.mark.parametrize("x, want", [(1, 2)])
def test_want_is_input(x, want):
    assert f(x) == want
    assert g(want) == 3


def test_inputs_a():
    for a, b in INPUTS:
        assert f(a) == b


def test_inputs_b():
    for a, b in INPUTS:
        assert g(b) == a


def test_not_equal():
    assert f(1) != 2
    assert f(1) in [1, 2]
'''
    armed = _armed(source)
    # test_want_is_input is armed by its literal 3; its parameter `want` is an input there, unchanged.
    assert armed == {"test_direct", "test_params", "test_table", "test_helper", "TestThing::test_method",
                     "Case::test_equal", "test_want_is_input"}, armed
    d = _decoy(source, 3)
    assert d is not None and d.changed >= 8
    new = d.files["tests/test_m.py"].decode()
    assert new.count("\n") == source.count("\n")  # every line stays where it was
    old_tree, new_tree = ast.parse(source), ast.parse(new)
    # Only constants change: the same statements, names and calls.
    strip = lambda t: [type(n).__name__ for n in ast.walk(t)]  # noqa: E731
    assert strip(old_tree) == strip(new_tree)
    # The inputs and the unarmed tests are untouched.
    for kept in ("f(1) == g(1)", "for a, b in INPUTS", "INPUTS = [(1, 1), (2, 0)]", "assert f(1) != 2",
                 "@pytest.mark.parametrize(\"x, want\", [(1, 2)])", "ROWS = [((1, 2)", "((2, 2),"):
        assert kept in new, kept


STYLED = '''from m import f


def test_styles():
    assert f(1) == "double quoted"
    assert f(2) == ['single', "mixed", 0x1F, 0o17, 0b101, 1_000_000, -7, 2.50]
    assert f(3) == {"k": [1, 2], 'z': b"ab\\n", "t": (True, "it's")}
    assert f(4) == """two "quoted"
lines"""
    assert f(5) == ("adjacent"  # a comment between
                    "strings" 'here')
    assert f(6) == {10, 20, 30}
'''


def _tokens(source: str) -> list[tuple[int, str, int, int]]:
    """(type, text, start offset, end offset) of each token, a sign joined to the number it
    precedes (a value may change sign)."""
    import io
    import tokenize

    starts = [0]
    for line in source.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    out: list[tuple[int, str, int, int]] = []
    for t in tokenize.generate_tokens(io.StringIO(source).readline):
        a, b = starts[t.start[0] - 1] + t.start[1], starts[t.end[0] - 1] + t.end[1]
        if t.type == tokenize.NUMBER and out and out[-1][:2] == (tokenize.OP, "-"):
            out[-1] = (t.type, source[out[-1][2]:b], out[-1][2], b)
        else:
            out.append((t.type, t.string, a, b))
    return out


def _style(token: str) -> tuple[str, str]:
    """What a literal's text says beside its value: a string's prefix and quotes; a number's base and grouping."""
    body = token.lstrip("bBuU")
    if body[:1] in "'\"":
        quote = body[:3] if body[:3] in ('"""', "\'\'\'") else body[0]
        return token[:len(token) - len(body)] + quote, quote
    digits = token.lstrip("-")
    base = digits[:2].lower() if digits[:2].lower() in ("0x", "0o", "0b") else ""
    return base, ("_" if "_" in digits else "") + (str(len(digits.partition(".")[2])) if "." in digits else "")


def test_a_decoy_differs_from_the_tests_only_in_the_changed_values():
    """Nothing but the values tells a decoy from the real tests: the same tokens on the same lines,
    a changed literal written in its original's style (prefix, quotes, base, grouping), the
    comments and spacing byte for byte."""
    import tokenize

    changed: set[str] = set()
    for seed in range(60):
        d = _decoy(STYLED, seed)
        assert d is not None
        new = d.files["tests/test_m.py"].decode()
        before, after = _tokens(STYLED), _tokens(new)
        assert [t[0] for t in before] == [t[0] for t in after]
        restored = new
        for (kind, old, *_), (_, text, a, b) in reversed(list(zip(before, after, strict=True))):
            restored = restored[:a] + old + restored[b:]
            if old != text:
                if kind == tokenize.NAME:  # a bool flips
                    assert {old, text} == {"True", "False"}, (old, text)
                    continue
                assert kind in (tokenize.STRING, tokenize.NUMBER), (old, text)
                assert _style(old) == _style(text), (old, text)
                changed.add(old)
        assert restored == STYLED  # the changed literals put back, it is the original byte for byte
    assert {'"double quoted"', "2.50", "0x1F", "0b101", "1_000_000", '"""two "quoted"\nlines"""', "'here'",
            'b"ab\\n"', '"it\'s"'} <= changed, changed


def test_a_test_defined_again_is_judged_by_its_last_definition():
    source = ("from m import f\n\n\ndef test_a():\n    assert f() == 1\n\n\ndef test_a():\n    assert f()\n\n\n"
              "def test_b():\n    assert f() == 2\n\n\ntest_b = None\n")
    assert _decoy(source) is None  # pytest runs the second test_a, and no test_b at all


def test_node_ids_match_armed_tests_whatever_the_rootdir_and_parameters():
    d = _decoy("from m import f\n\n\ndef test_a():\n    assert f() == 1\n\n\ndef test_b():\n    assert f()\n",
               path="pkg/tests/test_m.py")
    assert d is not None
    assert d.is_armed("pkg/tests/test_m.py::test_a") and d.is_armed("tests/test_m.py::test_a[1-2]")
    assert not d.is_armed("pkg/tests/test_m.py::test_b") and not d.is_armed("other/test_m.py::test_a")


def test_no_decoy_without_armed_tests():
    assert _decoy("def test_a():\n    assert True\n") is None
    assert make_decoy({"tests/data.json": b"{}", "tests/conftest.py": b"def test_x():\n    assert f() == 1\n"}, 0) is None


def test_bundled_humaneval_tests_are_armed(tmp_path):
    from tryloop.tasks.sources.humaneval import humaneval_tasks

    tasks = humaneval_tasks(tmp_path, limit=10)
    armed = [t.id for t in tasks if make_decoy(t.hidden_tests(), 0)]
    assert len(armed) >= 8, armed


# ---- end to end: the real verifier, real pytest, real sandboxes --------------------------------


@pytest.fixture(scope="module")
def table_task() -> Task:
    return Task.load(DATA / "table-tests")


async def test_a_correct_program_fails_every_armed_test_of_the_decoy(runtime, table_task):
    v = await verify(runtime, table_task, Submission(changes=dict(table_task.solution_files())))
    assert v.state == "pass" and v.reward and v.reward > 1.0, v.reason
    assert v.meta["decoy"]["armed_passed"] == 8 and v.meta["decoy"]["still_passed"] == [], v.meta["decoy"]
    assert not [f for f in v.flags if f.kind == EXPECTED_READ]


@pytest.mark.parametrize("attack", sorted(r.CAUGHT_BY_DECOYS))
async def test_reading_the_expected_values_pays_without_decoys_and_not_with_them(runtime, table_task, attack):
    # Partial credit, so that an attack that reads one kind of expectation (parameters, a table)
    # earns what it read even where it fails the other tests.
    spec, bare_spec = RewardSpec(partial_credit=True), RewardSpec(partial_credit=True, decoys=False)
    sub = r.run(attack, table_task)
    nothing = await verify(runtime, table_task, Submission(), bare_spec)
    bare = await verify(runtime, table_task, sub, bare_spec)
    # The attack is real: with no decoy run it earns more than the broken code, unflagged.
    assert bare.reward is not None and nothing.reward is not None and bare.reward > nothing.reward + 0.1, bare
    assert not [f for f in bare.flags if f.severity == "hack"], bare.flags
    if attack == "read_spy":  # the stand-in learns every expectation: every test passes
        assert bare.state == "pass" and set(bare.outcomes.values()) == {"passed"}, bare.reason
    v = await verify(runtime, table_task, sub, spec)
    assert v.state == "fail" and v.reward == 0.0, v.reason
    flag = next(f for f in v.flags if f.kind == EXPECTED_READ)
    assert flag.severity == "hack" and "still passed" in flag.detail
    assert v.meta["decoy"]["still_passed"], v.meta["decoy"]


async def test_the_decoy_runs_only_when_tests_pass(runtime, table_task):
    v = await verify(runtime, table_task, Submission())
    assert v.state == "fail" and "decoy" not in v.meta
