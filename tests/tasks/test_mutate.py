"""Mutation operators, candidates, combined bugs and bug reports — on real source and real pytest runs."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tryloop.assets import CALC_PROJECT
from tryloop.tasks.mutate import OPERATORS, Mutation, candidates, combine, site_counts
from tryloop.tasks.project import Project
from tryloop.tasks.report import STYLES, bug_report, fail_to_pass, failure_excerpt, leaks_fix
from tryloop.tasks.testrun import OUTCOME_SOURCE, TestRun

SRC = '''\
"""Shapes."""


def clamp(x, lo, hi):
    # keep x within [lo, hi]
    if x < lo:
        return lo
    elif x > hi:
        return hi
    else:
        return x


def total(xs):
    acc = 0
    for x in xs:
        acc += x * 2
    return acc


def first_even(xs):
    i = 0
    while i < len(xs) and xs[i] % 2:
        i += 1
    return xs[i] if i < len(xs) else None


def sign(x):
    if x >= 0:
        return 1
    else:
        return -1


class Box:
    def __init__(self, w, h):
        self.w = w
        self.h = h

    def area(self):
        return self.w * self.h

    def ratio(self):
        return divide(self.w, self.h)


def divide(a, b):
    return a / b
'''

TESTS = '''\
from shapes import Box, clamp, divide, first_even, sign, total


def test_clamp():
    assert clamp(5, 0, 10) == 5
    assert clamp(-1, 0, 10) == 0
    assert clamp(11, 0, 10) == 10


def test_total():
    assert total([1, 2, 3]) == 12


def test_first_even():
    assert first_even([1, 3, 4, 5]) == 4
    assert first_even([1, 3]) is None


def test_sign():
    assert sign(3) == 1
    assert sign(-3) == -1


def test_box():
    assert Box(2, 3).area() == 6
    assert Box(6, 3).ratio() == 2


def test_divide():
    assert divide(6, 3) == 2
'''


def pick(operator: str, lineno: int, summary: str | None = None, source: str = SRC) -> Mutation:
    found = [m for m in OPERATORS[operator](source, "shapes.py")
             if m.lineno == lineno and (summary is None or m.summary == summary)]
    assert len(found) == 1, [(m.lineno, m.summary) for m in OPERATORS[operator](source)]
    return found[0]


def replaced(old: str, new: str, source: str = SRC) -> str:
    assert source.count(old) == 1, old
    return source.replace(old, new)


# Exact output for one site of every operator.
EXPECTED = [
    ("binop_swap", 17, "'*' -> '/'", "        acc += x * 2\n", "        acc += x / 2\n"),
    ("binop_swap", 17, "'+=' -> '-='", "        acc += x * 2\n", "        acc -= x * 2\n"),
    ("compare_swap", 6, "'<' -> '<='", "    if x < lo:\n", "    if x <= lo:\n"),
    ("compare_swap", 6, "'<' -> '>'", "    if x < lo:\n", "    if x > lo:\n"),
    ("compare_swap", 29, "'>=' -> '>'", "    if x >= 0:\n", "    if x > 0:\n"),
    ("boolop_swap", 23, None, "while i < len(xs) and xs[i] % 2:", "while i < len(xs) or xs[i] % 2:"),
    ("off_by_one", 15, "0 -> 1", "    acc = 0\n", "    acc = 1\n"),
    ("off_by_one", 24, "1 -> 2", "        i += 1\n", "        i += 2\n"),
    ("off_by_one", 32, "1 -> 0", "        return -1\n", "        return -0\n"),
    ("remove_statement", 38, None, "        self.w = w\n        self.h = h\n", "        self.w = w\n"),
    ("remove_statement", 17, None, "        acc += x * 2\n", "        pass\n"),
    ("remove_branch", 8, None, "        return lo\n    elif x > hi:\n        return hi\n    else:",
     "        return lo\n    else:"),
    ("remove_branch", 10, None, "        return hi\n    else:\n        return x\n", "        return hi\n"),
    ("remove_branch", 29, "removed if block (kept its else) at line 29",
     "    if x >= 0:\n        return 1\n    else:\n        return -1\n", "    return -1\n"),
    ("remove_loop", 16, None, "    acc = 0\n    for x in xs:\n        acc += x * 2\n    return acc\n",
     "    acc = 0\n    return acc\n"),
    ("swap_if_else", 29, None, "        return 1\n    else:\n        return -1\n",
     "        return -1\n    else:\n        return 1\n"),
    ("swap_if_else", 25, None, "return xs[i] if i < len(xs) else None", "return None if i < len(xs) else xs[i]"),
    ("swap_arguments", 44, None, "divide(self.w, self.h)", "divide(self.h, self.w)"),
    ("drop_return_value", 48, None, "    return a / b\n", "    return None\n"),
    ("remove_method", 43, None, "        return self.w * self.h\n\n    def ratio(self):\n        return divide(self.w, self.h)\n",
     "        return self.w * self.h\n"),
    ("negate_condition", 29, None, "    if x >= 0:\n", "    if not (x >= 0):\n"),
    ("negate_condition", 25, None, "if i < len(xs) else None", "if not (i < len(xs)) else None"),
]


@pytest.mark.parametrize(("operator", "lineno", "summary", "old", "new"), EXPECTED,
                         ids=[f"{e[0]}-{e[1]}-{i}" for i, e in enumerate(EXPECTED)])
def test_operator_exact_output(operator, lineno, summary, old, new):
    m = pick(operator, lineno, summary)
    assert m.mutated == replaced(old, new)
    assert m.original == SRC and m.path == "shapes.py" and m.operator == operator
    assert m.edit == "text"  # the rest of the file is untouched text
    ast.parse(m.mutated)


def test_every_operator_is_covered_by_an_exact_test():
    assert {e[0] for e in EXPECTED} == set(OPERATORS)


def test_site_counts_and_every_mutation_parses_and_differs():
    counts = site_counts({"shapes.py": SRC})
    assert counts == {"binop_swap": 6, "compare_swap": 10, "boolop_swap": 1, "off_by_one": 13,
                      "remove_statement": 6, "remove_branch": 5, "remove_loop": 2, "swap_if_else": 3,
                      "swap_arguments": 1, "drop_return_value": 10, "remove_method": 3, "negate_condition": 5}
    original = ast.dump(ast.parse(SRC))
    for name, op in OPERATORS.items():
        muts = list(op(SRC, "shapes.py"))
        assert len(muts) == counts[name], name
        for m in muts:
            assert ast.dump(ast.parse(m.mutated)) != original
            assert "# keep x within [lo, hi]" in m.mutated
            assert m.edit == "text"


def test_enumeration_is_in_walk_order():
    lines = [m.lineno for m in OPERATORS["compare_swap"](SRC)]
    assert lines == sorted(lines)


def test_equivalent_and_excluded_sites_are_skipped():
    src = ("import typing\n\n\ndef f(a, n: int = 3) -> typing.List[int]:\n"
           "    g(a, a)\n    m = max(a, n)\n    return f\"{a + 1}\" + str(m)\n\n\n"
           "if __name__ == \"__main__\":\n    print(f(1, 2))\n")
    assert list(OPERATORS["swap_arguments"](src)) == []  # identical args, max()
    # the default 3 is mutated, not annotations, f-string internals or the __main__ block
    assert [(m.lineno, m.summary) for m in OPERATORS["off_by_one"](src)] == [(4, "3 -> 4"), (4, "3 -> 2")]
    assert list(OPERATORS["binop_swap"](src)) == []  # string concatenation, f-string
    assert list(OPERATORS["compare_swap"](src)) == []  # __name__ guard


def test_unusual_layout_falls_back_to_rendering_the_statement():
    src = "def f(a):\n    b = 0\n    if a: b = 1; a = 2\n    else: b = 2  # two\n    return a + b  # keep\n"
    m = pick("remove_branch", 3, "removed if block (kept its else) at line 3", source=src)
    assert m.edit == "statement"
    assert m.mutated == "def f(a):\n    b = 0\n    b = 2\n    return a + b  # keep\n"
    m = pick("remove_statement", 3, "removed statement `b = 1`", source=src)
    assert m.mutated == src.replace("if a: b = 1;", "if a: pass;")


def test_non_ascii_and_crlf_sources_keep_their_bytes_elsewhere():
    src = "def f(s):\r\n    t = 'é' + s  # é\r\n    return len(t) - 1\r\n"
    m = pick("binop_swap", 3, source=src)
    assert m.mutated == src.replace("len(t) - 1", "len(t) + 1")
    m = pick("off_by_one", 3, "1 -> 2", source=src)
    assert m.mutated == src.replace("len(t) - 1", "len(t) - 2")


# ---- candidates -----------------------------------------------------------------------------------

FILES = {"shapes.py": SRC, "pkg/other.py": "def g(a, b):\n    return a - b if a > b else 0\n",
         "broken.py": "def (:\n", "README.md": "x + y\n"}


def test_candidates_deterministic_seeded_and_capped():
    a = candidates(FILES, seed=7)
    b = candidates(dict(reversed(list(FILES.items()))), seed=7)
    assert [m.id for m in a] == [m.id for m in b]
    assert len(a) == sum(site_counts(FILES).values())
    assert {m.path for m in a} == {"shapes.py", "pkg/other.py"}  # no unparsable or non-Python files
    assert [m.id for m in candidates(FILES, seed=8)] != [m.id for m in a]
    assert len({m.id for m in a}) == len(a) and all(re.fullmatch(r"[0-9a-f]{12}", m.id) for m in a)
    capped = candidates(FILES, seed=7, limit=5)
    assert [m.id for m in capped] == [m.id for m in a[:5]]
    per = candidates(FILES, seed=7, per_file=2)
    assert sorted(m.path for m in per) == ["pkg/other.py", "pkg/other.py", "shapes.py", "shapes.py"]
    only = candidates(FILES, operators=["compare_swap"], seed=1)
    assert {m.operator for m in only} == {"compare_swap"} and len(only) == 12
    with pytest.raises(ValueError, match="unknown mutation operator"):
        candidates(FILES, operators=["nope"])


def test_candidates_accept_bytes_and_ids_are_stable():
    a = candidates({"shapes.py": SRC.encode()}, seed=3, limit=3)
    b = candidates({"shapes.py": SRC}, seed=3, limit=3)
    assert a == b
    m = a[0]
    assert m.id == Mutation(m.operator, m.path, m.lineno, m.col, "other summary", m.original, m.mutated).id


def test_calc_project_sites():
    project = Project(name="calc", root=CALC_PROJECT, source="bundled")
    counts = site_counts(project.source_files())
    assert counts["binop_swap"] == 2 and counts["drop_return_value"] == 2
    assert counts["negate_condition"] == 1 and counts["remove_branch"] == 1
    muts = candidates(project.source_files(), seed=0)
    assert len(muts) == sum(counts.values())


# ---- combined bugs --------------------------------------------------------------------------------


def test_combine_multi_file_and_same_file():
    other = FILES["pkg/other.py"]
    m1 = pick("binop_swap", 17, "'*' -> '/'")
    m2 = next(m for m in OPERATORS["compare_swap"](other, "pkg/other.py"))
    m3 = pick("drop_return_value", 48)
    multi = combine([m1, m2, m3])
    assert multi is not None
    assert multi.operator == "multi:binop_swap+compare_swap+drop_return_value"
    assert multi.path == "shapes.py" and multi.edit == "multi" and multi.parts == (m1, m2, m3)
    shapes_text = replaced("    return a / b\n", "    return None\n", m1.mutated)
    assert multi.changes == {"shapes.py": (SRC, shapes_text), "pkg/other.py": (other, m2.mutated)}
    applied = multi.apply(FILES)
    assert applied["shapes.py"] == shapes_text.encode() and applied["pkg/other.py"] == m2.mutated.encode()
    assert applied["README.md"] == b"x + y\n"
    assert multi.solution() == {"shapes.py": SRC.encode(), "pkg/other.py": other.encode()}
    assert multi.id != m1.id
    # overlapping changes cannot be combined
    assert combine([m1, pick("binop_swap", 17, "'+=' -> '-='")]) is None
    assert combine([m1]) is m1 and combine([]) is None


# ---- real test runs -------------------------------------------------------------------------------


# Per-test outcomes of a run on the host, classified as the harness does (no sandbox here).
REPORTER = """import json, os
_results = {}
""" + OUTCOME_SOURCE + """

def pytest_runtest_logreport(report):
    outcome = _outcome(report)
    if outcome is not None:
        _results[report.nodeid] = outcome

def pytest_sessionfinish(session, exitstatus):
    with open(os.environ["TRYLOOP_REPORT"], "w") as f:
        json.dump({"tests": _results}, f)
"""


def run_pytest(root: Path, report: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    if report is not None:
        plugin_dir = root.parent / "plugin"
        plugin_dir.mkdir(exist_ok=True)
        (plugin_dir / "tryloop_report.py").write_text(REPORTER)
        env.update(PYTHONPATH=str(plugin_dir), TRYLOOP_REPORT=str(report))
        cmd[4:4] = ["-p", "tryloop_report"]
    return subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=120)


def write_project(root: Path, source: str) -> Path:
    (root / "tests").mkdir(parents=True, exist_ok=True)
    (root / "shapes.py").write_text(source)
    (root / "tests" / "test_shapes.py").write_text(TESTS)
    return root


def test_mutations_break_a_real_test_suite(tmp_path):
    assert run_pytest(write_project(tmp_path / "orig", SRC)).returncode == 0
    chosen = [pick("binop_swap", 17, "'*' -> '/'"), pick("compare_swap", 6, "'<' -> '>'"),
              pick("off_by_one", 15, "0 -> 1"), pick("remove_branch", 8),
              pick("swap_arguments", 44), pick("remove_method", 43), pick("negate_condition", 29)]
    for k, m in enumerate(chosen):
        res = run_pytest(write_project(tmp_path / f"m{k}", m.mutated))
        assert res.returncode == 1, (m.operator, m.summary, res.stdout[-2000:])
        assert " failed" in res.stdout


def _runs(tmp_path: Path, mutated: str) -> tuple[TestRun, TestRun]:
    out = []
    for name, source in (("broken", mutated), ("fixed", SRC)):
        report = tmp_path / f"{name}.json"
        res = run_pytest(write_project(tmp_path / name, source), report)
        tests = json.loads(report.read_text())["tests"]
        out.append(TestRun(exit_code=res.returncode, outcomes=tests, output_tail=(res.stdout + res.stderr)[-4000:],
                           reported=True))
    return out[0], out[1]


def test_bug_report_describes_the_failure_not_the_fix(tmp_path):
    m = pick("binop_swap", 17, "'*' -> '/'")  # total([1, 2, 3]) == 3.0 instead of 12
    broken, fixed = _runs(tmp_path, m.mutated)
    assert fail_to_pass(broken, fixed) == ["tests/test_shapes.py::test_total"]
    for style in STYLES:
        text = bug_report("shapes", broken, fixed, seed=1, style=style)
        assert "test_total" in text
        assert "assert 3.0 == 12" in text
        assert "acc += x" not in text and "x * 2" not in text and "x / 2" not in text
        assert "shapes.py:17" not in text and "binop_swap" not in text
        assert text.rstrip().endswith(("Do not modify the tests.", "do not change the tests.",
                                       "passes again."))
        assert len(text.splitlines()) < 40
        assert not leaks_fix(text, m)
    assert bug_report("shapes", broken, fixed, seed=4) == bug_report("shapes", broken, fixed, seed=4)
    assert len({bug_report("shapes", broken, fixed, seed=s) for s in range(12)}) > 2
    with pytest.raises(ValueError):
        bug_report("shapes", broken, fixed, style="nope")


def test_bug_report_for_an_exception_drops_source_lines(tmp_path):
    m = pick("remove_statement", 38)  # Box has no attribute h
    broken, fixed = _runs(tmp_path, m.mutated)
    assert fail_to_pass(broken, fixed) == ["tests/test_shapes.py::test_box"]
    assert "self.w * self.h" in broken.output_tail  # pytest shows the source line...
    text = bug_report("shapes", broken, fixed, seed=0, style="regression")
    assert "AttributeError: 'Box' object has no attribute 'h'" in text
    assert "`test_box` now fails with `AttributeError`" in text
    assert "self.w * self.h" not in text  # ...the report does not
    assert not re.search(r"(?<!test_)shapes\.py", text)  # nor the file of the bug
    assert "tests/test_shapes.py:25:" in text
    excerpt = failure_excerpt(broken.output_tail, ["tests/test_shapes.py::test_box"])
    assert all(line.startswith(("E", "tests/")) for line in excerpt) and len(excerpt) <= 15
    assert not leaks_fix(text, m)


def test_leaks_fix_catches_planted_leaks():
    m = pick("drop_return_value", 48)
    clean = "When I run the tests, `test_divide` fails:\n\n```\nE  assert None == 2\n```\n"
    assert not leaks_fix(clean, m)
    assert leaks_fix(clean + "The culprit is `return a / b` in divide().", m)  # the original line
    assert leaks_fix(clean + "It does `return None`.", m)  # the mutated line (11 chars)
    assert leaks_fix(clean + "Look at shapes.py:48.", m)  # the place
    assert leaks_fix(clean + "(drop_return_value)", m)  # the operator
    m2 = pick("binop_swap", 17, "'*' -> '/'")
    assert leaks_fix("the loop does acc += x / 2 now", m2)
    assert leaks_fix("it should be `acc += x * 2`", m2)
    assert not leaks_fix("total([1, 2, 3]) returns 3.0", m2)
    # what the agent can read in the tests anyway is not a leak
    assert not leaks_fix("see `acc += x * 2`", m2, allowed="acc += x * 2")
