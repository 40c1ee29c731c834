"""Near-duplicate detection: tasks whose bug is the same code change up to names.

Exact duplicates share a fingerprint (the store keeps one copy). Near duplicates
are found by normalizing the change between the workspace and the reference
solution: the changed functions' ASTs with every identifier replaced by its
order of appearance, so a renamed variant of a task has the same key as the
task itself.
"""

from __future__ import annotations

import ast
import hashlib
from collections import defaultdict

from tryloop.tasks.model import Task


class _Normalize(ast.NodeTransformer):
    def __init__(self) -> None:
        self.names: dict[str, str] = {}

    def _n(self, name: str) -> str:
        return self.names.setdefault(name, f"v{len(self.names)}")

    def visit_Name(self, node: ast.Name) -> ast.AST:
        return ast.copy_location(ast.Name(id=self._n(node.id), ctx=node.ctx), node)

    def visit_arg(self, node: ast.arg) -> ast.AST:
        node.arg = self._n(node.arg)
        node.annotation = None
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        node.name = self._n(node.name)
        if node.body and isinstance(node.body[0], ast.Expr) and isinstance(getattr(node.body[0], "value", None),
                                                                            ast.Constant):
            node.body = node.body[1:] or [ast.Pass()]  # docstrings do not make a task different
        self.generic_visit(node)
        return node

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        self.generic_visit(node)
        node.attr = self._n(node.attr)
        return node


def _defs(src: bytes) -> dict[str, str] | None:
    try:
        tree = ast.parse(src)
    except (SyntaxError, ValueError):
        return None
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            out[f"{node.lineno}:{node.name}"] = ast.dump(_Normalize().visit(ast.parse(ast.unparse(node))),
                                                         annotate_fields=False)
    return out


def change_signature(task: Task) -> list[str]:
    """Normalized (before, after) of every function the reference solution changes."""
    ws = task.workspace_files()
    sigs = []
    for rel, after in sorted(task.solution_files().items()):
        before = ws.get(rel, b"")
        if not rel.endswith(".py"):
            sigs.append(f"{rel}:{hashlib.sha256(before).hexdigest()[:8]}>{hashlib.sha256(after).hexdigest()[:8]}")
            continue
        b, a = _defs(before), _defs(after)
        if b is None or a is None:
            sigs.append(hashlib.sha256(before + b"\0" + after).hexdigest())
            continue
        before_set, after_set = set(b.values()), set(a.values())
        changed = sorted(before_set ^ after_set)
        sigs.extend(changed)
    return sigs


def near_duplicate_key(task: Task) -> str | None:
    sig = change_signature(task)
    if not sig:
        return None
    return hashlib.sha256("\n".join(sig).encode()).hexdigest()


def near_duplicate_groups(tasks: list[Task]) -> list[list[str]]:
    """Ids of tasks sharing a near-duplicate key (groups of two or more)."""
    groups: dict[str, list[str]] = defaultdict(list)
    for t in tasks:
        key = near_duplicate_key(t)
        if key:
            groups[key].append(t.id)
    return [sorted(ids) for ids in groups.values() if len(ids) > 1]
