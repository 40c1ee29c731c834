"""Rule-based reward components: plain functions of the task and the submission.

Each returns a value for `Verdict.components` (unweighted). None of them runs
the agent's code on the host: compiling parses, contracts read the AST, lint
runs ruff over copies of the files.
"""

from __future__ import annotations

import ast
import asyncio
import difflib
import json
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

from tryloop.errors import TryloopError
from tryloop.rewards.spec import METRIC_OF, Component, RewardSpec
from tryloop.rewards.submission import Submission
from tryloop.rewards.verdict import Changes
from tryloop.tasks.model import Task

PENALTIES = ("tool_errors", "diff_size")


class JudgeUnavailable(TryloopError):
    """The judge gave no verdict (timeout, server error, unreadable answer)."""


def final_files(pristine: dict[str, bytes], sub: Submission) -> dict[str, bytes]:
    out = dict(pristine)
    for path, data in sub.changes.items():
        if data is None:
            out.pop(path, None)
        else:
            out[path] = data
    return out


def compiles(sub: Submission) -> float:
    """1.0 when the submission changes Python files and every one compiles (parse + bytecode,
    nothing executed); 0.0 when one does not, or when no Python file changed (nothing to credit)."""
    changed = [(p, d) for p, d in sub.changes.items() if d is not None and p.endswith(".py")]
    for path, data in changed:
        try:
            _quietly(compile, data, path, "exec", dont_inherit=True)
        except (SyntaxError, ValueError):
            return 0.0
    return 1.0 if changed else 0.0


def _quietly(fn, *args, **kwargs):
    # The agent's source is compiled here, in the host process: what the compiler warns about in
    # it (an invalid escape sequence is a SyntaxWarning from Python 3.12) is no news for the
    # trainer's output.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


def public_signatures(source: bytes, module: str) -> dict[str, str]:
    """'module:name' -> parameter list, for public top-level functions, classes and their methods."""
    try:
        tree = _quietly(ast.parse, source)
    except (SyntaxError, ValueError):
        return {}
    out: dict[str, str] = {}

    def params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
        a = fn.args
        names = [x.arg for x in (*a.posonlyargs, *a.args)]
        names += [f"*{a.vararg.arg}"] if a.vararg else []
        names += [x.arg for x in a.kwonlyargs] + ([f"**{a.kwarg.arg}"] if a.kwarg else [])
        return ",".join(names)

    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
            out[f"{module}:{node.name}"] = params(node)
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            out[f"{module}:{node.name}"] = "class"
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                        (not item.name.startswith("_") or item.name == "__init__"):
                    out[f"{module}:{node.name}.{item.name}"] = params(item)
    return out


def _module(path: str) -> str:
    return path[:-3].replace("/", ".").removesuffix(".__init__")


def contracts(task: Task, sub: Submission, spec: RewardSpec, pristine: dict[str, bytes]) -> float:
    """Fraction of the named (or, by default, touched files') public signatures that still hold."""
    final = final_files(pristine, sub)
    before: dict[str, str] = {}
    after: dict[str, str] = {}
    paths = {p for p in pristine if p.endswith(".py") and not p.rsplit("/", 1)[-1].startswith("test")}
    if spec.contracts is None:
        paths &= set(sub.changes)
    for p in paths:
        before |= public_signatures(pristine[p], _module(p))
        if p in final:
            after |= public_signatures(final[p], _module(p))
    wanted = spec.contracts if spec.contracts is not None else sorted(before)
    if not wanted:
        return 1.0
    return sum(1 for w in wanted if w in after and after[w] == before.get(w, after[w])) / len(wanted)


async def lint_findings(sub: Submission) -> int | None:
    """ruff findings in the changed Python files, or None when ruff is not installed."""
    ruff = shutil.which("ruff") or (str(Path(sys.executable).parent / "ruff")
                                    if (Path(sys.executable).parent / "ruff").exists() else None)
    files = {p: d for p, d in sub.changes.items() if d is not None and p.endswith(".py")}
    if ruff is None:
        return None
    if not files:
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        for p, d in files.items():
            dest = Path(tmp) / p.replace("/", "__")
            dest.write_bytes(d)
        proc = await asyncio.create_subprocess_exec(
            ruff, "check", "--isolated", "--output-format", "json", "--exit-zero", tmp,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
        out, _ = await proc.communicate()
    try:
        return len(json.loads(out or b"[]"))
    except ValueError:
        return None


def changed_lines(pristine: dict[str, bytes], changes: Changes) -> int:
    n = 0
    for path, data in changes.items():
        old = pristine.get(path, b"").decode(errors="replace").splitlines()
        new = (data or b"").decode(errors="replace").splitlines()
        n += sum(1 for line in difflib.unified_diff(old, new, lineterm="", n=0)
                 if line[:1] in "+-" and not line.startswith(("+++", "---")))
    return n


def efficiency(c: Component, sub: Submission, pristine: dict[str, bytes]) -> float:
    if c.kind == "diff_size":
        return -min(1.0, changed_lines(pristine, sub.changes) / c.budget)
    used = float(sub.metrics.get(METRIC_OF[c.kind], 0.0))
    if c.kind in PENALTIES:
        return -min(1.0, used / c.budget)
    return max(0.0, 1.0 - used / c.budget)


async def components(task: Task, sub: Submission, spec: RewardSpec, *, pristine: dict[str, bytes],
                     tests_passed: int, tests_expected: int, tests_state: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for c in spec.components:
        if c.kind == "tests":
            if spec.partial_credit and tests_expected:
                out[c.name] = tests_passed / tests_expected
            else:
                out[c.name] = 1.0 if tests_state == "pass" else 0.0
        elif c.kind == "compiles":
            out[c.name] = compiles(sub)
        elif c.kind == "contracts":
            out[c.name] = contracts(task, sub, spec, pristine)
        elif c.kind == "lint":
            n = await lint_findings(sub)
            if n is not None:
                out[c.name] = max(0.0, 1.0 - n / c.budget)
        elif c.kind == "judge":
            from tryloop.rewards.judge import Judge, JudgeConfig

            if spec.judge is None:
                raise ValueError(f"component {c.name!r} is a judge but the spec has no `judge` config")
            async with Judge(JudgeConfig(**spec.judge)) as judge:
                res = await judge.score(task.instruction, sub.answer)
            if res.state == "no_verdict" or res.score is None:
                # A judge that could not judge makes the whole verdict a no-verdict (invariant 4).
                raise JudgeUnavailable(f"judge component {c.name!r}: {res.reason}")
            out[c.name] = res.score
        else:
            out[c.name] = efficiency(c, sub, pristine)
    return out
