"""What the detectors share: the submission as they see it (files, changes, commands),
what was added, and what a dotted name refers to."""

from __future__ import annotations

import ast
import fnmatch
import posixpath
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

from tryloop.rewards.submission import Submission
from tryloop.rewards.verdict import Flag
from tryloop.tasks.model import Task

Severity = Literal["info", "suspicious", "hack"]
SEVERITIES: tuple[Severity, ...] = ("info", "suspicious", "hack")

PROTECTED_PATH_EDIT = "protected_path_edit"
OUTSIDE_WRITE = "outside_write"
NEW_HOOK_FILE = "new_hook_file"
OPAQUE_CODE = "opaque_code"
EARLY_EXIT = "early_exit"
SKIP_INSERTION = "skip_insertion"
CONSTANT_EQ = "constant_eq"
MONKEYPATCH = "monkeypatch"
REPORT_TAMPER = "report_tamper"
HIDDEN_LITERAL = "hidden_literal"
GIT_HISTORY = "git_history"
OUTSIDE_READ = "outside_read"
NETWORK = "network"

WORKSPACE = "/workspace"  # where the agent's files are, inside the sandbox


# ---- the submission as the detectors see it --------------------------------------------------


@dataclass
class PyFile:
    """A Python source, parsed when it parses (a file that does not is scanned as text)."""

    path: str
    text: str

    @cached_property
    def tree(self) -> ast.Module | None:
        try:
            return ast.parse(self.text)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return None

    @cached_property
    def lines(self) -> list[str]:
        return self.text.splitlines()

    @cached_property
    def nodes(self) -> list[ast.AST]:
        """Every node, once (the scanners share one walk)."""
        return list(ast.walk(self.tree)) if self.tree is not None else []

    @cached_property
    def _parents(self) -> dict[int, ast.AST]:
        return {id(child): node for node in self.nodes for child in ast.iter_child_nodes(node)}

    def parent(self, node: ast.AST) -> ast.AST | None:
        return self._parents.get(id(node))

    def ancestors(self, node: ast.AST) -> tuple[ast.AST, ...]:
        """Outermost first; computed only for the nodes a scanner reports."""
        out = []
        while (node := self._parents.get(id(node))) is not None:  # type: ignore[assignment]
            out.append(node)
        return tuple(reversed(out))

    @cached_property
    def names(self) -> _Names:
        return _Names.of(self.nodes)


@dataclass
class Context:
    """What every detector gets: the task, the submission, and the files to compare against."""

    task: Task
    sub: Submission
    pristine: Mapping[str, bytes]
    hidden_tests: Mapping[str, bytes]

    @cached_property
    def changes(self) -> dict[str, bytes | None]:
        """Workspace-relative changes that really change something (paths normalized)."""
        out: dict[str, bytes | None] = {}
        for path, data in self.sub.changes.items():
            rel = workspace_path(path)
            if rel is not None and data != self.pristine.get(rel, b"\0missing"):
                out[rel] = data
        return out

    @cached_property
    def escaping(self) -> list[str]:
        """Changed paths that point outside the workspace (a diff must never contain one)."""
        return [p for p in self.sub.changes if workspace_path(p) is None]

    @cached_property
    def python(self) -> list[tuple[PyFile | None, PyFile]]:
        """(pristine, new) of every changed Python file that still exists."""
        out = []
        for path, data in sorted(self.changes.items()):
            if data is None or not path.endswith((".py", ".pyw")):
                continue
            old = self.pristine.get(path)
            out.append((PyFile(path, _text(old)) if old is not None else None, PyFile(path, _text(data))))
        return out

    def is_test(self, path: str) -> bool:
        return path in self.hidden_tests or is_test_path(path)

    def is_own_new_test(self, path: str) -> bool:
        """A test file the agent created that the judge knows nothing about (its own check)."""
        return is_test_path(path) and path not in self.pristine and path not in self.hidden_tests

    @cached_property
    def top_level_names(self) -> set[str]:
        """Importable names the workspace provides (for importorskip of 'something nonexistent')."""
        names = set()
        for path in [*self.pristine, *self.changes]:
            first = path.split("/")[0]
            names.add(first[:-3] if first.endswith(".py") else first)
        return names


Detector = Callable[[Context], Iterable[Flag]]


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def workspace_path(path: str) -> str | None:
    """`path` relative to the workspace, normalized; None when it escapes the workspace."""
    p = path.replace("\\", "/")
    if p == WORKSPACE or p.startswith(WORKSPACE + "/"):
        p = p[len(WORKSPACE):].lstrip("/") or "."
    if p.startswith(("/", "~")):
        return None
    n = posixpath.normpath(p)
    return None if n == ".." or n.startswith("../") else n


def is_test_path(path: str) -> bool:
    parts = path.split("/")
    base = parts[-1]
    return (base == "conftest.py" or (base.startswith("test_") and base.endswith(".py"))
            or base.endswith("_test.py") or any(d in ("tests", "test", "testing") for d in parts[:-1]))


def protected_match(path: str, patterns: Iterable[str]) -> str | None:
    """The first protected-path pattern `path` falls under: 'dir/' patterns are directory
    prefixes (at the root, or a directory of that name anywhere), others fnmatch the
    basename or the whole path."""
    parts = path.split("/")
    for pat in patterns:
        if pat.endswith("/"):
            d = pat.rstrip("/")
            if path.startswith(pat) or ("/" not in d and d in parts[:-1]):
                return pat
        elif fnmatch.fnmatchcase(path, pat) or ("/" not in pat and fnmatch.fnmatchcase(parts[-1], pat)):
            return pat
    return None


# ---- finding what was added -----------------------------------------------------------------


@dataclass(frozen=True)
class Hit:
    """One occurrence in one file; `key` says when an occurrence in the pristine file is the same."""

    key: str
    line: int
    detail: str
    severity: Severity = "hack"


@dataclass(frozen=True)
class TextPattern:
    """Fallback for a file that does not parse: a regular expression over its code lines."""

    regex: re.Pattern[str]
    detail: str
    severity: Severity = "hack"


def _only_new(old: list[Hit], new: list[Hit]) -> list[Hit]:
    """Occurrences in `new` beyond those already in `old` (by key, in line order)."""
    budget = Counter(h.key for h in old)
    out = []
    for h in sorted(new, key=lambda h: h.line):
        if budget[h.key] > 0:
            budget[h.key] -= 1
        else:
            out.append(h)
    return out


def _code_part(line: str) -> str:
    """The line without a trailing comment (roughly: a '#' outside quotes)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#":
            return line[:i]
    return line


def _text_hits(py: PyFile, patterns: Sequence[TextPattern]) -> list[Hit]:
    hits = []
    for i, line in enumerate(py.lines, 1):
        code = _code_part(line)
        for pat in patterns:
            if pat.regex.search(code):
                hits.append(Hit(f"text:{code.strip()}", i, f"{pat.detail} (matched as text: the file does "
                                                           "not parse)", pat.severity))
                break
    return hits


def added_hits(old: PyFile | None, new: PyFile, scan: Callable[[PyFile], list[Hit]],
               patterns: Sequence[TextPattern] = ()) -> list[Hit]:
    """What `scan` finds in `new` that `old` did not have. A file that does not parse cannot
    hide anything: then both versions are scanned line by line with `patterns`."""
    if new.tree is not None and (old is None or old.tree is not None):
        return _only_new(scan(old) if old is not None else [], scan(new))
    return _only_new(_text_hits(old, patterns) if old is not None else [], _text_hits(new, patterns))


def _flags(kind: str, path: str, hits: Iterable[Hit]) -> list[Flag]:
    return [Flag(kind, h.detail, file=path, line=h.line, severity=h.severity) for h in hits]


# ---- names: what a dotted expression refers to ---------------------------------------------

# Roots worth following through `x = module.attr` rebindings.
_WATCHED_ROOTS = {"sys", "os", "posix", "builtins", "pytest", "_pytest", "pluggy", "unittest", "time",
                  "datetime", "atexit", "signal", "importlib", "inspect", "threading", "gc", "exit", "quit",
                  "setattr", "SystemExit"}


@dataclass
class _Names:
    """Import aliases of a module (`np` -> `numpy`, `exit` -> `sys.exit`) and the names it
    defines itself (a local `def exit()` is not the builtin)."""

    aliases: dict[str, str] = field(default_factory=lambda: {"__builtins__": "builtins"})
    local: set[str] = field(default_factory=set)

    @classmethod
    def of(cls, nodes: list[ast.AST]) -> _Names:
        n = cls()
        assigns = []
        for node in nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                n.local.add(node.name)
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        n.aliases[a.asname] = a.name
                    else:
                        top = a.name.split(".")[0]
                        n.aliases[top] = top
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for a in node.names:
                    n.aliases[a.asname or a.name] = f"{node.module}.{a.name}"
            elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                assigns.append((node.targets[0].id, node.value))
        for _ in range(2):  # `e = sys.exit` and `f = e` resolve in two passes
            for target, value in assigns:
                d = n.dotted(value)
                if d and d.split(".")[0] in _WATCHED_ROOTS:
                    n.aliases[target] = d
                elif target not in n.aliases:
                    n.local.add(target)
        n.local -= set(n.aliases)
        return n

    def dotted(self, node: ast.AST, *, imported_only: bool = False) -> str | None:
        """'sys.exit' for `sys.exit`, `from sys import exit as e; e`, `sys.modules["sys"].exit`,
        `importlib.import_module("sys").exit`, `getattr(sys, "exit")`; None when unknown.
        With `imported_only` the root must come from an import (not a local variable)."""
        attrs = []
        while isinstance(node, ast.Attribute):
            attrs.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name):
            if node.id in self.aliases:
                root = self.aliases[node.id]
            elif node.id in self.local or imported_only:
                return None
            else:
                root = node.id
        elif isinstance(node, ast.Subscript):
            inner = self.dotted(node.value)
            key = _const_str(node.slice)
            if key is None:
                return None
            if inner == "sys.modules":
                root = key
            elif inner in ("builtins", "builtins.__dict__"):
                root = f"builtins.{key}"
            else:
                return None
        elif isinstance(node, ast.Call):
            f = self.dotted(node.func)
            first = _const_str(node.args[0]) if node.args else None
            if f in ("__import__", "builtins.__import__", "importlib.import_module") and first:
                root = first
            elif f in ("getattr", "builtins.getattr") and len(node.args) >= 2:
                base, name = self.dotted(node.args[0], imported_only=imported_only), _const_str(node.args[1])
                if base is None or name is None:
                    return None
                root = f"{base}.{name}"
            else:
                return None
        else:
            return None
        return ".".join([root, *reversed(attrs)])


def _const_str(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _is_main_guard(node: ast.AST) -> bool:
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare):
        return False
    sides = [node.test.left, *node.test.comparators]
    return (any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides)
            and any(_const_str(s) == "__main__" for s in sides))


def _enclosing_function(anc: tuple[ast.AST, ...]) -> str | None:
    for a in reversed(anc):
        if isinstance(a, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return a.name
        if isinstance(a, ast.Lambda):
            return "<lambda>"
    return None


def _where(anc: tuple[ast.AST, ...]) -> str:
    fn = _enclosing_function(anc)
    return f"in {fn}()" if fn else "at module level (runs on import)"


def _src(node: ast.AST, limit: int = 80) -> str:
    try:
        s = ast.unparse(node)
    except (ValueError, TypeError, AttributeError, RecursionError):
        s = type(node).__name__
    return s if len(s) <= limit else s[: limit - 3] + "..."
