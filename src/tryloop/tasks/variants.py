"""Variants of a task: the same bug in differently written code, for diversity.

Three behaviour-preserving transforms of a project's Python sources:

* `rename_identifiers` — local variables and parameters get new names, consistently
  within each function (a symbol table per function scope; the change is applied
  token by token, checked with `tokenize`, so formatting and comments stay).
  Never renamed: module-level names (what tests import), attributes, keyword
  argument names, builtins, `self`/`cls`, names declared global/nonlocal, names
  bound by imports/except/match, names used inside f-strings, parameters of
  decorated functions, any name that appears as a keyword argument or a string
  anywhere in the project or its tests, and every name of a function that calls
  `locals`/`vars`/`eval`/`exec`/`dir`/`globals`.
* `reorder_functions` — top-level function and class definitions are shuffled
  within each run of consecutive definitions (no other statement in between),
  respecting what a definition needs when it executes (base classes, decorators,
  default values, annotations, class bodies). Definitions with decorators other
  than a few known pure ones stay where they are.
* `reformat` — `ast.unparse` normalization: whitespace, quotes and parentheses
  change, comments go.

Every result is checked: it must parse to the same AST (modulo the renaming, or as a
permutation of the same top-level statements). A transform that cannot be checked
leaves the file as it was.

`make_variant` applies one of them to a task: the same rename map / order to the
workspace and to the reference solution (computed on the solution, the original
code, and kept only where it applies to both), the hidden tests unchanged.
"""

from __future__ import annotations

import ast
import builtins
import fnmatch
import io
import keyword
import random
import tokenize
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from tryloop.tasks.model import Task
from tryloop.tasks.mutate import parse_module, splice

Files = Mapping[str, bytes | str]


class VariantError(ValueError):
    """The transform cannot make a valid variant of this task (e.g. it changes nothing)."""


# ---- helpers --------------------------------------------------------------------------------------



def _text(data: bytes | str) -> str | None:
    if isinstance(data, str):
        return data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _like_input(original: bytes | str, text: str) -> bytes | str:
    return text if isinstance(original, str) else text.encode("utf-8")


def _lines(text: str) -> list[str]:
    return io.StringIO(text, newline="").readlines()


def is_test_file(rel: str, patterns: Iterable[str] = ()) -> bool:
    """Test code and test configuration: never transformed (fixture names are parameters)."""
    name = rel.rsplit("/", 1)[-1]
    if name.startswith("test_") or name.endswith("_test.py") or name == "conftest.py":
        return True
    if rel.startswith(("tests/", "test/")) or "/tests/" in rel or "/test/" in rel:
        return True
    for p in patterns:
        if p.endswith("/"):
            if rel.startswith(p) or f"/{p}" in f"/{rel}":
                return True
        elif fnmatch.fnmatch(name, p) or fnmatch.fnmatch(rel, p):
            return True
    return False


def _identifiers(text: str) -> set[str]:
    """Every NAME token of a module (identifiers, keywords, attribute names)."""
    out: set[str] = set()
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text, newline="").readline):
            if tok.type == tokenize.NAME:
                out.add(tok.string)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    return out


def observed_names(texts: Iterable[str]) -> set[str]:
    """Names a rename must leave alone because something may refer to them by name:
    keyword arguments in calls and identifier-like string constants, in any file."""
    out: set[str] = set()
    for text in texts:
        tree = parse_module(text)
        if tree is None:
            continue
        literal_parts = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
        for node in ast.walk(tree):
            if isinstance(node, ast.keyword) and node.arg:
                out.add(node.arg)
            elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier()
                  and id(node) not in literal_parts):
                out.add(node.value)
    return out


# ---- rename ---------------------------------------------------------------------------------------

_FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)
_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_LAMBDA_OR_FUNC = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
_COMPS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
_DYNAMIC = {"locals", "vars", "eval", "exec", "dir", "globals"}
_NEVER = {"self", "cls", "_"} | set(dir(builtins)) | set(keyword.kwlist) | set(keyword.softkwlist)
_PURE_DECORATORS = {"staticmethod", "classmethod", "property", "dataclass", "dataclasses.dataclass", "lru_cache",
                    "functools.lru_cache", "cache", "functools.cache", "total_ordering", "functools.total_ordering",
                    "cached_property", "functools.cached_property", "contextmanager", "contextlib.contextmanager"}
PREFIXES = ("cur", "tmp", "val", "my", "the", "loc", "this", "new", "v", "x")

Plan = dict[str, dict[str, str]]  # scope key -> {old name: new name}


def _decorator_name(d: ast.expr) -> str:
    target = d.func if isinstance(d, ast.Call) else d
    try:
        return ast.unparse(target)
    except (ValueError, TypeError, AttributeError):
        return "?"


def _scopes(tree: ast.Module) -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function in pre-order with a stable key (qualified name, `#n` for repeats)."""
    out: list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]] = []
    seen: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, _DEFS):
                key = f"{prefix}{child.name}"
                seen[key] = seen.get(key, 0) + 1
                if seen[key] > 1:
                    key = f"{key}#{seen[key]}"
                if isinstance(child, _FUNCS):
                    out.append((key, child))
                visit(child, key + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return out


def _walk_body(func: ast.FunctionDef | ast.AsyncFunctionDef) -> Iterable[ast.AST]:
    """Everything evaluated in (or nested inside) the function's own scope: its body, not
    its decorators, defaults or annotations (those run in the enclosing scope)."""
    for stmt in func.body:
        yield from ast.walk(stmt)


def _own_bindings(func: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """Names bound by plain assignment (Name stores/deletes) in the function's own scope."""
    out: set[str] = set()
    stack: list[ast.AST] = list(func.body)
    while stack:
        node = stack.pop()
        if isinstance(node, _SCOPES + _COMPS):
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
            out.add(node.id)
        stack.extend(ast.iter_child_nodes(node))
    return out


def _unrenamable(func: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str] | None:
    """Names of the function's subtree that must keep their name; None: leave the function alone."""
    out: set[str] = set()
    for node in _walk_body(func):
        if isinstance(node, ast.Name) and node.id in _DYNAMIC:
            return None
        if isinstance(node, ast.Global | ast.Nonlocal):
            out.update(node.names)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            out.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.ExceptHandler | ast.MatchAs | ast.MatchStar) and node.name:
            out.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            out.add(node.rest)
        elif isinstance(node, ast.JoinedStr):
            out.update(n.id for n in ast.walk(node) if isinstance(n, ast.Name))
        elif isinstance(node, _DEFS):
            out.add(node.name)
            if isinstance(node, ast.ClassDef):  # class-body bindings are attributes
                for stmt in node.body:
                    out.update(n.id for n in ast.walk(stmt) if isinstance(n, ast.Name)
                               and isinstance(n.ctx, ast.Store))
                    if isinstance(stmt, _DEFS):
                        out.add(stmt.name)
    return out


def _params(func: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> list[ast.arg]:
    a = func.args
    return [*a.posonlyargs, *a.args, *([a.vararg] if a.vararg else []), *a.kwonlyargs,
            *([a.kwarg] if a.kwarg else [])]


def _renamable(func: ast.FunctionDef | ast.AsyncFunctionDef, observed: set[str]) -> set[str]:
    blocked = _unrenamable(func)
    if blocked is None:
        return set()
    names = _own_bindings(func)
    decorated = [d for d in func.decorator_list if _decorator_name(d) not in _PURE_DECORATORS]
    if not decorated:  # a decorator may call the function by keyword or inspect its signature
        names |= {a.arg for a in _params(func)}
    return {n for n in names - blocked - observed - _NEVER if not n.startswith("__")}


def _occurrences(func: ast.FunctionDef | ast.AsyncFunctionDef, names: set[str]) -> list[tuple[ast.AST, str]]:
    """(node, name) of every Name/arg that spells one of `names` in the function's scope."""
    out: list[tuple[ast.AST, str]] = [(a, a.arg) for a in _params(func) if a.arg in names]
    for node in _walk_body(func):
        if isinstance(node, ast.Name) and node.id in names:
            out.append((node, node.id))
        elif isinstance(node, _LAMBDA_OR_FUNC):
            out.extend((a, a.arg) for a in _params(node) if a.arg in names)
    return out


class _Source:
    def __init__(self, text: str):
        self.text = text
        self.lines = _lines(text)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))

    def pos(self, lineno: int, col_bytes: int) -> tuple[int, int]:
        """(line, character column) of an AST position."""
        line = self.lines[lineno - 1]
        col = col_bytes if line.isascii() else len(line.encode("utf-8")[:col_bytes].decode("utf-8", "ignore"))
        return lineno, col


def make_rename_plan(text: str, seed: int | str, observed: set[str] = frozenset()) -> Plan:
    """{scope: {old: new}} for one module: what `rename_identifiers` would rename."""
    tree = parse_module(text)
    if tree is None:
        return {}
    rng = random.Random(seed)
    taken = _identifiers(text) | _NEVER
    plan: Plan = {}
    for key, func in _scopes(tree):
        names = sorted(_renamable(func, set(observed)))
        if not names:
            continue
        mapping: dict[str, str] = {}
        for old in names:
            base = old.lstrip("_") or "v"
            new = f"{rng.choice(PREFIXES)}_{base}"
            n = 2
            while new in taken:
                new = f"{rng.choice(PREFIXES)}_{base}{n}"
                n += 1
            taken.add(new)
            mapping[old] = new
        plan[key] = mapping
    return plan


def restrict_plan(plan: Plan, text: str, observed: set[str] = frozenset()) -> Plan:
    """The part of `plan` that also applies to `text` (another version of the module)."""
    tree = parse_module(text)
    if tree is None:
        return {}
    taken = _identifiers(text)
    scopes = dict(_scopes(tree))
    out: Plan = {}
    for key, mapping in plan.items():
        func = scopes.get(key)
        if func is None:
            continue
        ok = _renamable(func, set(observed))
        kept = {o: n for o, n in mapping.items() if o in ok and n not in taken}
        if kept:
            out[key] = kept
    return out


def apply_rename_plan(text: str, plan: Plan) -> str:
    """Rename per `plan` token by token; the text unchanged if the result does not check out."""
    tree = parse_module(text)
    if tree is None or not plan:
        return text
    src = _Source(text)
    edits: dict[tuple[int, int], tuple[str, str]] = {}
    for key, func in _scopes(tree):
        mapping = plan.get(key)
        if not mapping:
            continue
        allowed = _renamable(func, set())
        mapping = {o: n for o, n in mapping.items() if o in allowed}
        for node, old in _occurrences(func, set(mapping)):
            at = src.pos(node.lineno, node.col_offset)
            edits.setdefault(at, (old, mapping[old]))  # an outer scope's rename wins
    if not edits:
        return text
    names: dict[tuple[int, int], str] = {}
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text, newline="").readline):
            if tok.type == tokenize.NAME:
                names[tok.start] = tok.string
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return text
    out, pos = [], 0
    for (line, col), (old, new) in sorted(edits.items()):
        if names.get((line, col)) != old:
            return text  # the AST and the tokens disagree: leave the file alone
        offset = src.starts[line - 1] + col
        out.append(text[pos:offset])
        out.append(new)
        pos = offset + len(old)
    out.append(text[pos:])
    result = "".join(out)
    inverse = {new: old for mapping in plan.values() for old, new in mapping.items()}
    return result if _same_modulo_rename(tree, result, inverse) else text


def _same_modulo_rename(tree: ast.Module, text: str, inverse: dict[str, str]) -> bool:
    new = parse_module(text)
    if new is None:
        return False
    for node in ast.walk(new):
        if isinstance(node, ast.Name) and node.id in inverse:
            node.id = inverse[node.id]
        elif isinstance(node, ast.arg) and node.arg in inverse:
            node.arg = inverse[node.arg]
    return ast.dump(new) == ast.dump(tree)


def rename_identifiers(files: Files, seed: int, *, observed: set[str] | None = None) -> dict[str, bytes | str]:
    """Rename local variables and parameters in every non-test Python file of `files`."""
    texts = {p: t for p, d in files.items() if p.endswith(".py") and (t := _text(d)) is not None}
    seen = observed_names(texts.values()) if observed is None else observed
    out = dict(files)
    for path, text in sorted(texts.items()):
        if is_test_file(path):
            continue
        plan = make_rename_plan(text, f"{seed}:{path}", seen)
        out[path] = _like_input(files[path], apply_rename_plan(text, plan))
    return out


# ---- reorder --------------------------------------------------------------------------------------


def _movable(stmt: ast.stmt) -> bool:
    return isinstance(stmt, _DEFS) and all(
        _decorator_name(d) in _PURE_DECORATORS for d in stmt.decorator_list)


def _deftime_names(stmt: ast.AST) -> set[str]:
    """Names a def/class statement reads when it executes (not when its functions run)."""
    out: set[str] = set()
    stack: list[ast.AST] = [stmt]
    while stack:
        node = stack.pop()
        if isinstance(node, _LAMBDA_OR_FUNC):
            a = node.args
            parts: list[ast.AST | None] = [*a.defaults, *a.kw_defaults]
            if isinstance(node, _FUNCS):
                parts += [*node.decorator_list, node.returns,
                          *(p.annotation for p in _params(node))]
            stack.extend(p for p in parts if p is not None)
        else:
            if isinstance(node, ast.Name):
                out.add(node.id)
            stack.extend(ast.iter_child_nodes(node))
    return out


def _runs(tree: ast.Module) -> list[list[int]]:
    """Indexes of top-level statements in maximal runs of movable definitions (length >= 2,
    no name defined twice)."""
    runs: list[list[int]] = []
    cur: list[int] = []
    for i, stmt in enumerate([*tree.body, None]):
        if stmt is not None and _movable(stmt):
            cur.append(i)
            continue
        names = [tree.body[k].name for k in cur]
        if len(cur) >= 2 and len(set(names)) == len(names):
            runs.append(cur)
        cur = []
    return runs


def _deps(tree: ast.Module, run: list[int]) -> dict[str, set[str]]:
    names = {tree.body[k].name for k in run}
    return {tree.body[k].name: (_deftime_names(tree.body[k]) & names) - {tree.body[k].name} for k in run}


def make_reorder_plan(text: str, seed: int | str) -> dict[str, int]:
    """{definition name: rank}: a seeded order of each run that respects def-time needs."""
    tree = parse_module(text)
    if tree is None:
        return {}
    rng = random.Random(seed)
    plan: dict[str, int] = {}
    for run in _runs(tree):
        deps = _deps(tree, run)
        order: list[str] = []
        left = [tree.body[k].name for k in run]
        while left:
            ready = [n for n in left if not (deps[n] - set(order))]
            pick = rng.choice(ready)
            order.append(pick)
            left.remove(pick)
        for rank, name in enumerate(order):
            plan[name] = rank + run[0] * 1_000_000
    return plan


def apply_reorder_plan(text: str, plan: Mapping[str, int]) -> str:
    tree = parse_module(text)
    if tree is None or not plan:
        return text
    src = _Source(text)
    pieces: list[tuple[int, int, str]] = []  # (start offset, end offset, new text)
    for run in _runs(tree):
        stmts = [tree.body[k] for k in run]
        if any(s.name not in plan for s in stmts):
            continue
        new_order = sorted(stmts, key=lambda s: plan[s.name])
        deps = _deps(tree, run)
        placed: set[str] = set()
        valid = True
        for s in new_order:
            if deps[s.name] - placed:
                valid = False
            placed.add(s.name)
        if not valid or new_order == stmts:
            continue
        spans = []
        prev_end = stmts[0].lineno - 1
        for k, s in enumerate(stmts):
            first = min([s.lineno, *(d.lineno for d in s.decorator_list)])
            lower = tree.body[run[0] - 1].end_lineno if k == 0 and run[0] > 0 else prev_end
            while first - 1 > lower and src.lines[first - 2].lstrip().startswith("#"):
                first -= 1  # the comment block right above belongs to the definition
            spans.append((first, s.end_lineno))
            prev_end = s.end_lineno
        chunks = {s.name: "".join(src.lines[a - 1:b]) for s, (a, b) in zip(stmts, spans, strict=True)}
        chunks = {n: c if c.endswith(("\n", "\r")) else c + "\n" for n, c in chunks.items()}
        gaps = ["".join(src.lines[spans[k][1]:spans[k + 1][0] - 1]) for k in range(len(spans) - 1)]
        body = "".join(chunks[s.name] + (gaps[k] if k < len(gaps) else "") for k, s in enumerate(new_order))
        pieces.append((src.starts[spans[0][0] - 1], src.starts[spans[-1][1]], body))
    if not pieces:
        return text
    result = splice(text, pieces)
    return result if result is not None and _same_statements(tree, result, plan) else text


def _same_statements(tree: ast.Module, text: str, plan: Mapping[str, int]) -> bool:
    new = parse_module(text)
    if new is None or len(new.body) != len(tree.body):
        return False
    old_d, new_d = [ast.dump(s) for s in tree.body], [ast.dump(s) for s in new.body]
    if sorted(old_d) != sorted(new_d):
        return False
    moved = {i for run in _runs(tree) for i in run}
    return all(old_d[i] == new_d[i] for i in range(len(old_d)) if i not in moved)


def reorder_functions(files: Files, seed: int) -> dict[str, bytes | str]:
    """Shuffle top-level definitions (where order cannot matter) in every non-test Python file."""
    out = dict(files)
    for path, data in sorted(files.items()):
        text = _text(data)
        if not path.endswith(".py") or text is None or is_test_file(path):
            continue
        out[path] = _like_input(data, apply_reorder_plan(text, make_reorder_plan(text, f"{seed}:{path}")))
    return out


# ---- reformat -------------------------------------------------------------------------------------


def reformat_source(text: str) -> str:
    tree = parse_module(text)
    if tree is None:
        return text
    try:
        result = ast.unparse(tree) + "\n"
    except (ValueError, TypeError, AttributeError, RecursionError):
        return text
    new = parse_module(result)
    return result if new is not None and ast.dump(new) == ast.dump(tree) else text


def reformat(files: Files, seed: int = 0) -> dict[str, bytes | str]:
    """`ast.unparse` every non-test Python file (`seed` is unused: the result is canonical)."""
    out = dict(files)
    for path, data in sorted(files.items()):
        text = _text(data)
        if path.endswith(".py") and text is not None and not is_test_file(path):
            out[path] = _like_input(data, reformat_source(text))
    return out


# ---- variants of a task ---------------------------------------------------------------------------


def _rename_versions(texts: list[str], seed: str, observed: set[str]) -> list[str]:
    plan = make_rename_plan(texts[0], seed, observed)
    for other in texts[1:]:
        plan = restrict_plan(plan, other, observed)
    return [apply_rename_plan(t, plan) for t in texts]


def _reorder_versions(texts: list[str], seed: str, observed: set[str]) -> list[str]:
    plan = make_reorder_plan(texts[0], seed)
    return [apply_reorder_plan(t, plan) for t in texts]


def _reformat_versions(texts: list[str], seed: str, observed: set[str]) -> list[str]:
    return [reformat_source(t) for t in texts]


KINDS: dict[str, Callable[[list[str], str, set[str]], list[str]]] = {
    "rename": _rename_versions, "reorder": _reorder_versions, "reformat": _reformat_versions}


def make_variant(task: Task, dest: str | Path, kind: str, seed: int) -> Task:
    """A variant of `task` written to `dest`: its workspace and reference solution transformed
    alike (`kind`: rename | reorder | reformat), hidden tests and grading unchanged, same
    family and split. Raises VariantError when the transform changes nothing or would make
    the workspace equal to the solution."""
    if kind not in KINDS:
        raise ValueError(f"unknown variant kind {kind!r}; known: {sorted(KINDS)}")
    ws, sol, tests = task.workspace_files(), task.solution_files(), task.hidden_tests()
    texts = [t for d in (*ws.values(), *sol.values(), *tests.values()) if (t := _text(d)) is not None]
    observed = observed_names(texts)
    new_ws, new_sol = dict(ws), dict(sol)
    changed = False
    for path in sorted(set(ws) | set(sol)):
        if not path.endswith(".py") or is_test_file(path, task.meta.protected_paths):
            continue
        versions = [(name, files, _text(files[path])) for name, files in (("solution", sol), ("workspace", ws))
                    if path in files]
        if any(text is None for _, _, text in versions):
            continue
        results = KINDS[kind]([text for _, _, text in versions], f"{seed}:{kind}:{path}", observed)
        for (_, files, text), result in zip(versions, results, strict=True):
            if result != text:
                changed = True
            (new_sol if files is sol else new_ws)[path] = result.encode("utf-8")
        if path in ws and path in sol and ws[path] != sol[path] and new_ws[path] == new_sol[path]:
            raise VariantError(f"{task.id}: the {kind} variant makes {path} identical to the solution")
    if not changed:
        raise VariantError(f"{task.id}: the {kind} transform (seed {seed}) changes nothing")
    meta = task.meta.model_copy(update={
        "id": f"{task.id}-v{kind}{seed}", "source": "variant", "split": task.meta.split,
        "origin": {"parent": task.id, "parent_fingerprint": task.fingerprint(), "kind": kind, "seed": seed,
                   "parent_origin": dict(task.meta.origin)},
    })
    return Task.create(dest, meta, task.instruction, workspace=new_ws, tests=tests, solution=new_sol)
