"""Bug reports for synthesized tasks: the observed failure, never the fix.

A planted bug is described the way a user or a CI run would see it: which tests
fail and what pytest printed for them. Only lines that describe the failure are
kept — pytest's `E   ...` lines, the short summary (`FAILED tests/...::test - ...`)
and `path:line: ErrorType` locations inside test files. Source lines (`>` lines,
indented code) and locations in non-test files are dropped, so the report names
neither the file, the line nor the code of the bug. `leaks_fix` double-checks a
finished instruction against the mutation; the factory rejects tasks that leak.
"""

from __future__ import annotations

import difflib
import random
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tryloop.tasks.mutate import Mutation
    from tryloop.tasks.testrun import TestRun

FAILING = ("failed", "error")
MAX_LINES = 15
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_HEADER = re.compile(r"^_{2,} (.+?) _{2,}$")
_SECTION_END = re.compile(r"^={3,} .* ={3,}$|^-{3,} .* -{3,}$")
_LOCATION = re.compile(r"^(\S+\.py):(\d+):(?: (\w[\w.]*))?$")
_SUMMARY = re.compile(r"^(FAILED|ERROR) (\S+?)(?: - (.*))?$")
_WHERE = re.compile(r"^E\s+\+\s+where (.+?) = ([A-Za-z_][\w.]*\(.*\))$")
_EXC = re.compile(r"^E\s+((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Warning))(?::|$)")

CLOSINGS = (
    "Please fix the code so that the test suite passes. Do not modify the tests.",
    "Please fix the bug in the code so that all tests pass; do not change the tests.",
    "Fix the code (not the tests) so that the whole test suite passes again.",
)


def fail_to_pass(broken: TestRun, fixed: TestRun) -> list[str]:
    """Tests that fail (or error) in `broken` and pass in `fixed`, in the order they ran."""
    if broken.outcomes:
        return [t for t, o in broken.outcomes.items()
                if o in FAILING and fixed.outcomes.get(t, "passed" if not fixed.outcomes else None) == "passed"]
    # No per-test report: fall back on pytest's short summary lines.
    failing_fixed = {m.group(2) for m in map(_SUMMARY.match, _clean(fixed.output_tail)) if m}
    found = [m.group(2) for m in map(_SUMMARY.match, _clean(broken.output_tail)) if m]
    return [t for t in dict.fromkeys(found) if t not in failing_fixed]


def _clean(text: str) -> list[str]:
    return [_ANSI.sub("", line).rstrip() for line in text.splitlines()]


def _test_file(nodeid: str) -> str:
    return nodeid.split("::")[0]


def _head_line(nodeid: str) -> str:
    """pytest's section title for a test: `test_x`, `TestA.test_x`, `test_x[1-2]`."""
    return ".".join(nodeid.split("::")[1:]) or nodeid


def _short_name(nodeid: str) -> str:
    return nodeid.split("::")[-1] if "::" in nodeid else nodeid


def _is_test_path(path: str, test_files: set[str]) -> bool:
    name = path.rsplit("/", 1)[-1]
    return (path in test_files or any(path.endswith("/" + t) or t.endswith("/" + path) for t in test_files)
            or name.startswith("test_") or name.endswith("_test.py") or name == "conftest.py"
            or path.startswith("tests/") or "/tests/" in path)


def failure_excerpt(output: str, tests: list[str], *, max_lines: int = MAX_LINES) -> list[str]:
    """The lines of pytest's output that describe how `tests` failed, with no source code:
    `E` lines and test-file locations from each test's section, else the summary lines."""
    return _excerpt(output, tests, max_lines)[0]


def _excerpt(output: str, tests: list[str], max_lines: int = MAX_LINES) -> tuple[list[str], list[str]]:
    """(excerpt lines, the tests whose failure they show)."""
    lines = _clean(output)
    test_files = {_test_file(t) for t in tests}
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in lines:
        header = _HEADER.match(line)
        if header:
            current = sections.setdefault(header.group(1).strip(), [])
            continue
        if _SECTION_END.match(line):
            current = None
            continue
        if current is None:
            continue
        if line.startswith("E ") or line == "E":
            current.append(line[:200])
        else:
            loc = _LOCATION.match(line)
            if loc and _is_test_path(loc.group(1), test_files):
                current.append(line)
    out: list[str] = []
    shown: list[str] = []
    for t in tests:
        body = sections.get(_head_line(t)) or sections.get(_short_name(t))
        if not body:
            continue
        e_lines = [ln for ln in body if ln.startswith("E")][:8]
        locs = [ln for ln in body if not ln.startswith("E")][-1:]
        block = [f"{t}:", *e_lines, *locs]
        if len(out) + len(block) > max_lines:
            room = max_lines - len(out)
            if room >= 3:
                out.extend(block[:room])
                shown.append(t)
            break
        out.extend(block)
        shown.append(t)
    if out:
        return out, shown
    wanted = set(tests)
    summary = [(ln[:200], m.group(2)) for ln in lines if (m := _SUMMARY.match(ln)) and m.group(2) in wanted]
    summary = summary[:max_lines]
    return [ln for ln, _ in summary], [t for _, t in summary]


def _symptom(excerpt: list[str]) -> tuple[str | None, str | None, str | None]:
    """(call, value it returned, exception type) read off the first failure."""
    call = value = exc = None
    for line in excerpt:
        if call is None and (m := _WHERE.match(line)):
            value, call = m.group(1), m.group(2)
        if exc is None and (m := _EXC.match(line)):
            exc = m.group(1)
    if exc in ("AssertionError",) and call is not None:
        exc = None
    return call, value, exc


def _names(tests: list[str], limit: int = 5) -> str:
    shown = [f"`{_short_name(t)}`" for t in tests[:limit]]
    more = len(tests) - len(shown)
    if more > 0:
        shown.append(f"{more} more")
    if len(shown) == 1:
        return shown[0]
    return ", ".join(shown[:-1]) + " and " + shown[-1]


def _style_suite(project: str, tests: list[str], excerpt: str, symptom: tuple, rng: random.Random) -> str:
    files = sorted({_test_file(t) for t in tests})
    where = f" (in `{files[0]}`)" if len(files) == 1 else ""
    verb = "fails" if len(tests) == 1 else "fail"
    opener = rng.choice(["When I run the test suite of `{p}`, {n}{w} {v}:",
                         "The tests of `{p}` do not pass: {n}{w} {v}."])
    return opener.format(p=project, n=_names(tests), w=where, v=verb) + f"\n\n{excerpt}"


def _style_regression(project: str, tests: list[str], excerpt: str, symptom: tuple, rng: random.Random) -> str:
    call, value, exc = symptom
    first = f"`{_short_name(tests[0])}`"
    if exc:
        what = f"{first} now fails with `{exc}`."
    elif call and value:
        what = f"`{call}` returns the wrong value (`{value}`), so {first} fails."
    else:
        what = f"{first} fails."
    others = ""
    if len(tests) > 1:
        others = f" The failing tests are {_names(tests)}."
    return f"After the last change to `{project}`, something broke: {what}{others}\n\n{excerpt}"


def _style_ci(project: str, tests: list[str], excerpt: str, symptom: tuple, rng: random.Random) -> str:
    listed = "\n".join(f"- `{t}`" for t in tests[:8])
    if len(tests) > 8:
        listed += f"\n- ... and {len(tests) - 8} more"
    return f"CI is red for `{project}`. These tests fail:\n\n{listed}\n\nThe relevant output:\n\n{excerpt}"


def _style_user(project: str, tests: list[str], excerpt: str, symptom: tuple, rng: random.Random) -> str:
    call, value, exc = symptom
    if exc:
        what = f"it raises `{exc}`"
    elif call and value:
        what = f"`{call}` gives `{value}`, which is not what the tests expect"
    else:
        what = "the results are wrong"
    return (f"I think there is a bug in `{project}`: {what}. {_names(tests)} "
            f"{'fails' if len(tests) == 1 else 'fail'}. This is what pytest prints:\n\n{excerpt}")


STYLES = {"suite": _style_suite, "regression": _style_regression, "ci": _style_ci, "user": _style_user}


def bug_report(project_name: str, broken: TestRun, fixed: TestRun, *, seed: int = 0,
               style: str | None = None) -> str:
    """An instruction for a task whose broken state is `broken` and reference state `fixed`:
    the failing tests and what pytest printed for them, in one of a few phrasings
    (`style`, or chosen by `seed`). It never shows the code that is wrong."""
    rng = random.Random(seed)
    if style is None:
        style = rng.choice(sorted(STYLES))
    if style not in STYLES:
        raise ValueError(f"unknown bug report style {style!r}; known: {sorted(STYLES)}")
    tests = fail_to_pass(broken, fixed)
    if not tests:
        tests = [t for t, o in broken.outcomes.items() if o in FAILING]
    closing = rng.choice(CLOSINGS)
    if not tests:
        return f"The test suite of `{project_name}` fails.\n\n{closing}\n"
    excerpt_lines, shown = _excerpt(broken.output_tail, tests)
    # the test whose output is shown first is the one the prose talks about
    tests = [*shown[:1], *(t for t in tests if t not in shown[:1])]
    excerpt = "```\n" + "\n".join(excerpt_lines) + "\n```" if excerpt_lines else "(pytest printed no details)"
    body = STYLES[style](project_name, tests, excerpt, _symptom(excerpt_lines), rng)
    return f"{body}\n\n{closing}\n"


# ---- leak check -----------------------------------------------------------------------------------

MIN_LEAK = 9  # shorter snippets (`a - b`, `x = 0`) say too little to count as a leak


def _squash(text: str) -> str:
    return " ".join(text.split())


def _changed_lines(original: str, mutated: str) -> list[tuple[str, int, int]]:
    """(line, start, end) for each changed line of either version, with the changed
    character range inside it (the whole stripped line when lines were added/removed)."""
    a, b = original.splitlines(), mutated.splitlines()
    out: list[tuple[str, int, int]] = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        if tag == "replace" and i2 - i1 == j2 - j1:
            for x, y in zip(a[i1:i2], b[j1:j2], strict=True):
                p = 0
                while p < min(len(x), len(y)) and x[p] == y[p]:
                    p += 1
                s = 0
                while s < min(len(x), len(y)) - p and x[len(x) - 1 - s] == y[len(y) - 1 - s]:
                    s += 1
                out.append((x, p, len(x) - s))
                out.append((y, p, len(y) - s))
        else:
            for line in (*a[i1:i2], *b[j1:j2]):
                indent = len(line) - len(line.lstrip())
                out.append((line, indent, len(line.rstrip())))
    return out


def _changed_linenos(original: str, mutated: str) -> set[int]:
    a, b = original.splitlines(), mutated.splitlines()
    out: set[int] = set()
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag != "equal":
            out.update(range(i1 + 1, max(i2, i1 + 1) + 1))
            out.update(range(j1 + 1, max(j2, j1 + 1) + 1))
    return out


def leaks_fix(instruction: str, mutation: Mutation, *, allowed: str = "") -> bool:
    """Whether `instruction` gives the fix away: it names the operator, points at a changed
    line of a changed file, or quotes code around the change (the original or the mutated
    version, at least MIN_LEAK characters that cover the changed characters). Snippets
    that also occur in `allowed` (e.g. the test files, which the agent sees anyway) are
    not counted."""
    text = instruction
    squashed, allowed_sq = _squash(instruction), _squash(allowed)
    ops = mutation.operator.removeprefix("multi:").split("+")
    if any(op in text for op in ops):
        return True
    for path, (original, mutated) in mutation.changes.items():
        name = re.escape(path.rsplit("/", 1)[-1])
        for n in sorted(_changed_linenos(original, mutated) | {mutation.lineno} if path == mutation.path
                        else _changed_linenos(original, mutated)):
            if re.search(rf"(?<!\w){name}\"?(?::|,? line ){n}\b", text):
                return True
        for line, start, end in _changed_lines(original, mutated):
            indent = len(line) - len(line.lstrip())
            whole = _squash(line)
            if len(whole) >= MIN_LEAK and whole in squashed and whole not in allowed_sq:
                return True
            # the shortest window [x, y) with x <= start, y >= end, y - x >= MIN_LEAK, for every x
            for x in range(indent, min(start, len(line) - 1) + 1):
                if line[x].isspace():
                    continue
                y = max(end, x + MIN_LEAK)
                while y < len(line) and line[y - 1].isspace():
                    y += 1
                if y > len(line):
                    break
                window = line[x:y]
                if window in text and window not in allowed:
                    return True
    return False
