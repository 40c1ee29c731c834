"""Function tasks judged on the host: the sandbox sees the hidden inputs, never the expected values.

A function task's hidden test (tryloop.tasks.sources.functions) is a table of
inputs and expected outputs. The verifier does not lay that table over the
workspace. It writes a probe in its place, at the same path: one test per input
that calls the candidate and appends `[index, output]` as JSON to a file. The
host reads the outputs back and compares them with the expected values it kept:
a test passes when its probe passed and its output equals the expected one
(within 1e-6 for float functions, as the hidden test says).

What this gives: code under test cannot read, copy or compare against the
expected values (they are not in the sandbox), and cannot fake a comparison
(outputs are plain JSON compared by the host, so objects equal to anything,
patched pytest reports or rewritten asserts change nothing). The output file
is not authenticated: the code under test can write it, but without the
expected values that gains nothing a correct function would not.
"""

from __future__ import annotations

import ast
import json
import secrets
from dataclasses import dataclass
from typing import Any

from tryloop.tasks.harness import RunRecord
from tryloop.tasks.model import Task

PROBE_TEST = "test_output"


@dataclass
class HostCheck:
    """The probe that replaces a function task's hidden test, and what the host keeps."""

    test_path: str
    function: str
    inputs: list[tuple]
    expected: list[Any]
    approx: bool
    outputs_path: str

    def hidden(self) -> dict[str, bytes]:
        """The hidden tests as the sandbox gets them: the probe at the test's path."""
        rows = ",\n".join(f"    {a!r}" for a in self.inputs)
        probe = (f'"""Outputs of {self.function} on the hidden inputs (the host compares them)."""\n\n'
                 f"import json\n\nimport pytest\n\nfrom solution import {self.function}\n\n"
                 f"INPUTS = [\n{rows},\n]\n\n\n"
                 f"@pytest.mark.parametrize('i', range(len(INPUTS)))\n"
                 f"def {PROBE_TEST}(i):\n"
                 f"    line = json.dumps([i, {self.function}(*INPUTS[i])])\n"
                 f"    with open({self.outputs_path!r}, 'a') as f:\n"
                 f"        f.write(line + '\\n')\n")
        return {self.test_path: probe.encode()}

    def test_id(self, i: int) -> str:
        return f"{self.test_path}::{PROBE_TEST}[{i}]"

    def judge(self, run: RunRecord) -> None:
        """Per-test outcomes from the probe's outcomes and the host's comparison (in place)."""
        outputs: dict[int, Any] = {}
        for line in run.read_back.decode(errors="replace").splitlines():
            try:
                i, value = json.loads(line)
            except (ValueError, TypeError, RecursionError):  # nested too deep for the parser: no answer
                continue
            if isinstance(i, int) and i not in outputs:  # the first answer counts
                outputs[i] = value
        for i, want in enumerate(self.expected):
            tid = self.test_id(i)
            if run.outcomes.get(tid) == "passed" and not self._equal(outputs.get(i, _MISSING), want):
                run.outcomes[tid] = "failed"

    def _equal(self, got: Any, want: Any) -> bool:
        if got is _MISSING:
            return False
        want = json.loads(json.dumps(want))  # tuples become lists, as the output's JSON has them
        if self.approx and isinstance(got, (int, float)) and isinstance(want, (int, float)) \
                and not isinstance(got, bool):
            return abs(got - want) < 1e-6
        return got == want  # as the hidden test compares (True == 1 there too)


_MISSING = object()


def host_check(task: Task) -> HostCheck | None:
    """The host check of a function task, or None when the task is not one (its hidden test is
    not a single `CASES` table of literal inputs and outputs for a `solution` function)."""
    from tryloop.tasks.sources.functions import SOURCE, TEST_FILE

    if task.meta.source != SOURCE:
        return None
    hidden = task.hidden_tests()
    if set(hidden) != {TEST_FILE}:
        return None
    text = hidden[TEST_FILE].decode()
    tree = ast.parse(text)
    function = next((a.name for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "solution"
                     for a in n.names), None)
    cases = next((n.value for n in tree.body if isinstance(n, ast.Assign)
                  and any(isinstance(t, ast.Name) and t.id == "CASES" for t in n.targets)), None)
    if function is None or cases is None:
        return None
    try:
        table = ast.literal_eval(cases)
    except ValueError:
        return None
    return HostCheck(test_path=TEST_FILE, function=function, inputs=[tuple(a) for a, _ in table],
                     expected=[e for _, e in table], approx="abs(got - expected) < 1e-6" in text,
                     outputs_path=f"/tmp/.o{secrets.token_hex(8)}.jsonl")
