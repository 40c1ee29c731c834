"""Plant bugs in working Python projects with AST mutation operators.

A *site* is one place in a module where an operator applies (one comparison,
one statement, one call...). Every operator enumerates all of its sites in a
module in a fixed order (a pre-order walk of the AST, in source order) and
yields one `Mutation` per site. `candidates` does this across a project's files,
shuffles the sites with a seed and materializes them lazily until a cap.

How `mutated` is produced. The rest of the file must stay as it was (comments,
formatting, quotes), so every site carries a *text edit* on the original source,
computed from node positions (lineno/col_offset/end_lineno/end_col_offset) and,
for operator tokens, from the few characters between two operands. Every site
also carries the same change as an *AST transform*. The text edit is accepted only
if the whole lines it touches (the innermost statement that owns its lines, parsed
on its own) parse to exactly the transformed AST — the rest of the file is the same
text, so the file parses iff those lines do, and the check costs the same in a
small module or a huge one. When the edit does not check out (an unusual layout:
`if x: y` on one line, `;`-joined statements, backslashes...), that statement is
re-rendered with `ast.unparse` in place of its own lines; only if that fails too is
the whole module re-rendered. `Mutation.edit` records which ("text", "statement",
"module"; "multi" for `combine`).

| operator | change | text edit |
|---|---|---|
| binop_swap | `+`<->`-`, `*`<->`/`, `//`<->`%`, `**`->`*`, `<<`<->`>>`, `&`<->`|`, `^`->`&` (also in `x += ...`) | the operator token |
| compare_swap | `<`<->`<=`, `>`<->`>=`, `<`<->`>`, `<=`<->`>=`, `==`<->`!=`, `is`<->`is not`, `in`<->`not in` (a `<` gives two sites: `<=` and `>`) | the operator token(s) |
| boolop_swap | `and`<->`or` (all operators of one chain) | the keywords |
| off_by_one | integer literal c -> c+1, and c -> c-1 when c >= 1 (two sites per literal) | the literal |
| remove_statement | drop an expression statement / assignment / augmented assignment inside a function (a body left empty gets `pass`) | delete its lines |
| remove_branch | drop an `if` block (keeping its `else` body or turning its `elif` into `if`), an `elif` branch, or an `else` branch | delete lines (+ dedent / `elif`->`if`) |
| remove_loop | drop a `for` / `while` loop inside a function | delete its lines |
| swap_if_else | swap the bodies of `if`/`else`, or the two values of `a if c else b` | swap the two blocks |
| swap_arguments | swap two adjacent, different positional arguments of a call | swap the two segments |
| drop_return_value | `return <expr>` -> `return None` | the return statement |
| remove_method | delete a method from a class that keeps at least one other statement | delete its lines |
| negate_condition | `if c` / `while c` / `a if c else b` -> `not c` (or `not c` -> `c`) | the condition |

remove_statement, remove_branch, remove_loop, drop_return_value, and swap_if_else /
negate_condition on `if`/`while` statements only touch code inside functions, so that
import-time code (module constants guarded by `if`, script entry points) stays intact.
Nothing inside annotations, f-strings, `if __name__ == "__main__":` or
`if TYPE_CHECKING:` blocks is mutated. A mutation whose AST equals the original's
(swapping identical arguments, ...) is skipped.

`combine` merges several mutations (in different files, or in non-overlapping lines
of one file) into one harder bug, operator `multi:<op>+<op>...`.
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import io
import random
import re
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

Files = Mapping[str, bytes | str]


@dataclass(frozen=True)
class Mutation:
    """One planted bug. `summary` is provenance only: it is never shown to the agent."""

    operator: str
    path: str
    lineno: int
    col: int
    summary: str
    original: str
    mutated: str
    edit: str = "text"  # text | statement | module | multi: how `mutated` was produced
    # More files changed by a combined (multi-file) mutation: (path, original, mutated).
    extra: tuple[tuple[str, str, str], ...] = ()
    parts: tuple[Mutation, ...] = ()  # the mutations a combined one is made of

    @property
    def id(self) -> str:
        h = hashlib.sha256()
        for value in (self.path, self.operator, str(self.lineno), str(self.col), self.mutated):
            h.update(value.encode())
            h.update(b"\0")
        for path, _, mutated in self.extra:
            h.update(f"{path}\0{mutated}\0".encode())
        return h.hexdigest()[:12]

    @property
    def changes(self) -> dict[str, tuple[str, str]]:
        """{path: (original source, mutated source)} of every file this mutation changes."""
        out = {self.path: (self.original, self.mutated)}
        out.update({p: (o, m) for p, o, m in self.extra})
        return out

    def apply(self, files: Files) -> dict[str, bytes]:
        """A copy of `files` with the mutated sources laid over (the broken workspace)."""
        out = {k: (v.encode() if isinstance(v, str) else v) for k, v in files.items()}
        out.update({p: m.encode() for p, (_, m) in self.changes.items()})
        return out

    def solution(self) -> dict[str, bytes]:
        """The original sources of the changed files (the reference solution)."""
        return {p: o.encode() for p, (o, _) in self.changes.items()}


# ---- source positions -----------------------------------------------------------------------------


def parse_module(text: str) -> ast.Module | None:
    """The module's AST, or None if it does not parse (warnings silenced)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _lines(text: str) -> list[str]:
    """Lines with their endings, split the way the tokenizer counts them (\\n, \\r\\n, \\r)."""
    return io.StringIO(text, newline="").readlines()


def _preorder(tree: ast.AST) -> list[tuple[ast.AST, ast.AST | None]]:
    """(node, parent) in pre-order, children in field (source) order. Iterative: deep trees are fine."""
    out: list[tuple[ast.AST, ast.AST | None]] = []
    stack: list[tuple[ast.AST, ast.AST | None]] = [(tree, None)]
    while stack:
        node, parent = stack.pop()
        out.append((node, parent))
        children = list(ast.iter_child_nodes(node))
        stack.extend((c, node) for c in reversed(children))
    return out


def _is_main_guard(node: ast.If) -> bool:
    t = node.test
    if isinstance(t, ast.Name) and t.id == "TYPE_CHECKING":
        return True
    if isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING":
        return True
    return (isinstance(t, ast.Compare) and isinstance(t.left, ast.Name) and t.left.id == "__name__"
            and len(t.comparators) == 1 and isinstance(t.comparators[0], ast.Constant)
            and t.comparators[0].value == "__main__")


_FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)


def _never_mutated(node: ast.AST, parent: ast.AST | None) -> bool:
    """f-strings, `__main__` / TYPE_CHECKING guards and annotations (with what is under them)."""
    if isinstance(node, ast.JoinedStr) or (isinstance(node, ast.If) and _is_main_guard(node)):
        return True
    if isinstance(parent, ast.arg | ast.AnnAssign) and node is parent.annotation:
        return True
    return isinstance(parent, _FUNCS) and node is parent.returns


class _Module:
    """A parsed module with the bookkeeping the operators need."""

    def __init__(self, text: str, tree: ast.Module):
        self.text = text
        self.tree = tree
        self.lines = _lines(text)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))
        pairs = _preorder(tree)
        self.nodes = [n for n, _ in pairs]
        self.index = {id(n): i for i, n in enumerate(self.nodes)}
        self.parents = {id(n): p for n, p in pairs}
        self.excluded: set[int] = set()
        self.in_func: set[int] = set()
        for node, parent in pairs:
            pid = id(parent) if parent is not None else None
            if pid is not None and (pid in self.in_func or isinstance(parent, _FUNCS)):
                self.in_func.add(id(node))
            if (pid is not None and pid in self.excluded) or _never_mutated(node, parent):
                self.excluded.add(id(node))

    @classmethod
    def load(cls, source: bytes | str) -> _Module | None:
        if isinstance(source, bytes):
            try:
                source = source.decode("utf-8")
            except UnicodeDecodeError:
                return None
        if source.startswith("\ufeff"):
            return None
        tree = parse_module(source)
        return None if tree is None else cls(source, tree)

    # positions ----------------------------------------------------------------------------------

    def off(self, lineno: int, col: int) -> int:
        """Character offset of (1-based line, UTF-8 byte column)."""
        line = self.lines[lineno - 1] if lineno - 1 < len(self.lines) else ""
        if not line.isascii():
            col = len(line.encode("utf-8")[:col].decode("utf-8", "ignore"))
        return self.starts[lineno - 1] + col

    def span(self, node: ast.AST) -> tuple[int, int]:
        return (self.off(node.lineno, node.col_offset), self.off(node.end_lineno, node.end_col_offset))

    def seg(self, node: ast.AST) -> str:
        a, b = self.span(node)
        return self.text[a:b]

    def char_col(self, node: ast.AST) -> int:
        return self.off(node.lineno, node.col_offset) - self.starts[node.lineno - 1]

    def ok(self, node: ast.AST) -> bool:
        return id(node) not in self.excluded

    def infunc(self, node: ast.AST) -> bool:
        return id(node) in self.in_func and id(node) not in self.excluded

    def line_text(self, lineno: int) -> str:
        return self.lines[lineno - 1].rstrip("\r\n") if 0 < lineno <= len(self.lines) else ""

    def eol(self, lineno: int) -> str:
        line = self.lines[lineno - 1] if 0 < lineno <= len(self.lines) else "\n"
        return line[len(line.rstrip("\r\n")):] or "\n"

    def whole_lines(self, node: ast.stmt) -> tuple[int, int] | None:
        """(first, last) 1-based lines if `node` (with its decorators) owns them alone."""
        first = node.lineno
        decorators = getattr(node, "decorator_list", None) or []
        if decorators:
            first = min(d.lineno for d in decorators)
            if not self.line_text(first).lstrip().startswith("@"):
                return None
        else:
            a = self.off(node.lineno, node.col_offset)
            if self.text[self.starts[first - 1]:a].strip():
                return None
        b = self.off(node.end_lineno, node.end_col_offset)
        rest = self.text[b:self.starts[node.end_lineno]].strip()
        if rest and not rest.startswith("#"):
            return None
        return first, node.end_lineno

    def ends_line(self, node: ast.AST) -> bool:
        """Nothing but blanks or a comment follows `node` on its last line."""
        b = self.off(node.end_lineno, node.end_col_offset)
        rest = self.text[b:self.starts[node.end_lineno]].strip()
        return not rest or rest.startswith("#")

    def lines_span(self, first: int, last: int) -> tuple[int, int]:
        return self.starts[first - 1], self.starts[last]

    def indent(self, lineno: int) -> str:
        line = self.line_text(lineno)
        return line[:len(line) - len(line.lstrip())]

    def find_between(self, a: int, b: int, pattern: str) -> tuple[int, int] | None:
        """The one match of `pattern` in text[a:b] (comments blanked), as absolute offsets."""
        gap = re.sub(r"#[^\r\n]*", lambda m: " " * len(m.group()), self.text[a:b])
        found = list(re.finditer(pattern, gap))
        if len(found) != 1:
            return None
        return a + found[0].start(), a + found[0].end()


Edit = tuple[int, int, str]


@dataclass
class _Site:
    index: int                       # pre-order index of the node `transform` is applied to
    lineno: int
    col: int
    summary: str
    edits: list[Edit] | None         # text edits on the original source; None: none possible
    transform: Callable[[ast.AST], None]
    # Statement replacement: the whole lines `lines` (one statement of the owner's body, with
    # blank lines around it at most) become `replacement` (zero or more statements).
    lines: tuple[int, int] | None = None
    old: ast.stmt | None = None
    replacement: list[ast.stmt] | None = None


def splice(text: str, edits: list[Edit]) -> str | None:
    """`text` with each (start, end, replacement) edit applied; None if edits overlap."""
    edits = sorted(edits)
    for (_, e1, _), (s2, _, _) in zip(edits, edits[1:], strict=False):
        if s2 < e1:
            return None
    out, pos = [], 0
    for s, e, rep in edits:
        out.append(text[pos:s])
        out.append(rep)
        pos = e
    out.append(text[pos:])
    return "".join(out)


def _owner(mod: _Module, node: ast.AST) -> tuple[ast.AST, str, int] | None:
    """(parent, field, position) of a statement in its parent's statement list."""
    parent = mod.parents.get(id(node))
    if parent is None:
        return None
    for name, value in ast.iter_fields(parent):
        if isinstance(value, list):
            for k, item in enumerate(value):
                if item is node:
                    return parent, name, k
    return None


def _render(mod: _Module, stmts: list[ast.stmt], first: int, last: int) -> Edit | None:
    """An edit replacing lines first..last by `stmts`, rendered with `ast.unparse`."""
    try:
        rendered = "\n".join(ast.unparse(s) for s in stmts)
    except (ValueError, TypeError, AttributeError, RecursionError):
        return None
    indent, eol = mod.indent(first), mod.eol(last)
    body = "".join(indent + line + eol if line.strip() else line + eol for line in rendered.split("\n"))
    a, b = mod.lines_span(first, last)
    return a, b, body if stmts else ""


def _dumps(stmts: Iterable[ast.AST]) -> str:
    return "\n".join(ast.dump(s) for s in stmts)


def _parse_lines(text: str, indent: str) -> list[ast.stmt] | None:
    """The statements of whole lines cut out of a module (indented lines parse under `if 1:`)."""
    if text and not text.endswith(("\n", "\r")):
        text += "\n"
    sentinel = indent + "pass\n"  # a body of only comments is still a body
    tree = parse_module(("if 1:\n" if indent else "") + text + sentinel)
    if tree is None:
        return None
    stmts = tree.body[0].body if indent else tree.body
    return stmts[:-1]


def _statement_around(mod: _Module, node: ast.AST) -> ast.stmt | None:
    """The innermost statement around `node` (or `node` itself) that owns its lines and
    parses on its own (so not an `elif` branch)."""
    cur: ast.AST | None = node
    while cur is not None and not isinstance(cur, ast.Module):
        if isinstance(cur, ast.stmt) and mod.whole_lines(cur) is not None and not (
                isinstance(cur, ast.If) and _starts_with(mod, cur, "elif")):
            return cur
        cur = mod.parents.get(id(cur))
    return None


def _materialize(mod: _Module, site: _Site, operator: str, path: str) -> Mutation | None:
    """Turn a site into a Mutation (None if it is equivalent or cannot be written).

    Text edits are checked on the few whole lines they touch (a statement, parsed
    alone): the rest of the file is the same text, so the file parses iff they do,
    and the cost does not grow with the size of the module. Only the last resort,
    re-rendering the whole module, looks at the whole file.
    """
    made = _materialize_lines(mod, site)
    if made is False:
        return None  # equivalent
    if made is not None:
        text, how = made
        return Mutation(operator=operator, path=path, lineno=site.lineno, col=site.col, summary=site.summary,
                        original=mod.text, mutated=text, edit=how)
    fresh = parse_module(mod.text)
    if fresh is None:
        return None
    site.transform([n for n, _ in _preorder(fresh)][site.index])
    ast.fix_missing_locations(fresh)
    try:
        expected = ast.dump(fresh)
        text = ast.unparse(fresh) + "\n"
    except (ValueError, TypeError, AttributeError, RecursionError):
        return None
    tree = parse_module(text)
    if expected == ast.dump(mod.tree) or tree is None or ast.dump(tree) != expected:
        return None
    return Mutation(operator=operator, path=path, lineno=site.lineno, col=site.col, summary=site.summary,
                    original=mod.text, mutated=text, edit="module")


def _materialize_lines(mod: _Module, site: _Site) -> tuple[str, str] | bool | None:
    """(mutated text, how) | False (equivalent) | None (not possible line-locally)."""
    if site.lines is not None and site.old is not None and site.replacement is not None:
        first, last = site.lines
        before, expected_stmts = ast.dump(site.old), site.replacement
    else:
        stmt = _statement_around(mod, mod.nodes[site.index])
        if stmt is None:
            return None
        first, last = mod.whole_lines(stmt)
        a, b = mod.lines_span(first, last)
        fresh = _parse_lines(mod.text[a:b], mod.indent(first))
        if fresh is None or len(fresh) != 1:
            return None
        fresh_nodes = [n for n, _ in _preorder(fresh[0])]
        local = site.index - mod.index[id(stmt)]
        if not 0 <= local < len(fresh_nodes) or type(fresh_nodes[local]) is not type(mod.nodes[site.index]):
            return None
        before = ast.dump(fresh[0])
        site.transform(fresh_nodes[local])
        ast.fix_missing_locations(fresh[0])
        expected_stmts = fresh
    try:
        expected = _dumps(expected_stmts)
    except (AttributeError, TypeError):
        return None
    if expected == before:
        return False
    a, b = mod.lines_span(first, last)
    old_text, indent = mod.text[a:b], mod.indent(first)

    def attempt(edits: list[Edit | None] | None) -> str | None:
        if not edits or any(e is None or e[0] < a or e[1] > b for e in edits):
            return None
        new_text = splice(old_text, [(s - a, e - a, r) for s, e, r in edits])
        if new_text is None or new_text == old_text:
            return None
        stmts = _parse_lines(new_text, indent)
        if stmts is None or _dumps(stmts) != expected:
            return None
        return mod.text[:a] + new_text + mod.text[b:]

    text = attempt(site.edits)
    if text is not None:
        return text, "text"
    text = attempt([_render(mod, expected_stmts, first, last)])
    if text is not None:
        return text, "statement"
    return None


# ---- operators ------------------------------------------------------------------------------------

_OP_TEXT: dict[type, str] = {
    ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%", ast.Pow: "**",
    ast.LShift: "<<", ast.RShift: ">>", ast.BitAnd: "&", ast.BitOr: "|", ast.BitXor: "^", ast.MatMult: "@",
}
_BINOP_SWAP: dict[type, type] = {
    ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Mod,
    ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult, ast.LShift: ast.RShift, ast.RShift: ast.LShift,
    ast.BitAnd: ast.BitOr, ast.BitOr: ast.BitAnd, ast.BitXor: ast.BitAnd,
}
_CMP_TEXT: dict[type, tuple[str, str]] = {  # (pattern, text)
    ast.Lt: ("<", "<"), ast.LtE: ("<=", "<="), ast.Gt: (">", ">"), ast.GtE: (">=", ">="),
    ast.Eq: ("==", "=="), ast.NotEq: ("!=", "!="), ast.Is: (r"\bis\b", "is"),
    ast.IsNot: (r"\bis\s+not\b", "is not"), ast.In: (r"\bin\b", "in"), ast.NotIn: (r"\bnot\s+in\b", "not in"),
}
_CMP_SWAP: dict[type, tuple[type, ...]] = {
    ast.Lt: (ast.LtE, ast.Gt), ast.LtE: (ast.Lt, ast.GtE), ast.Gt: (ast.GtE, ast.Lt), ast.GtE: (ast.Gt, ast.LtE),
    ast.Eq: (ast.NotEq,), ast.NotEq: (ast.Eq,), ast.Is: (ast.IsNot,), ast.IsNot: (ast.Is,),
    ast.In: (ast.NotIn,), ast.NotIn: (ast.In,),
}


def _is_str(node: ast.AST) -> bool:
    return isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, str | bytes))


def _binop_swap(mod: _Module) -> Iterator[_Site]:
    for i, node in enumerate(mod.nodes):
        if not mod.ok(node):
            continue
        if isinstance(node, ast.BinOp):
            left, right, suffix = node.left, node.right, ""
            if isinstance(node.op, ast.Mod) and _is_str(left):
                continue  # "%s" % x is formatting, not arithmetic
            if isinstance(node.op, ast.Add) and (_is_str(left) or _is_str(right)):
                continue  # string concatenation
        elif isinstance(node, ast.AugAssign):
            left, right, suffix = node.target, node.value, "="
        else:
            continue
        new = _BINOP_SWAP.get(type(node.op))
        if new is None:
            continue
        old_text, new_text = _OP_TEXT[type(node.op)] + suffix, _OP_TEXT[new] + suffix
        where = mod.find_between(mod.span(left)[1], mod.span(right)[0], re.escape(old_text))
        edits = [(where[0], where[1], new_text)] if where else None

        def transform(n: ast.AST, new: type = new) -> None:
            n.op = new()

        yield _Site(i, node.lineno, mod.char_col(node), f"'{old_text}' -> '{new_text}'", edits, transform)


def _compare_swap(mod: _Module) -> Iterator[_Site]:
    for i, node in enumerate(mod.nodes):
        if not isinstance(node, ast.Compare) or not mod.ok(node):
            continue
        operands = [node.left, *node.comparators]
        for k, op in enumerate(node.ops):
            pattern, old_text = _CMP_TEXT[type(op)]
            where = mod.find_between(mod.span(operands[k])[1], mod.span(operands[k + 1])[0], pattern)
            for new in _CMP_SWAP[type(op)]:
                new_text = _CMP_TEXT[new][1]
                edits = [(where[0], where[1], new_text)] if where else None

                def transform(n: ast.AST, k: int = k, new: type = new) -> None:
                    n.ops[k] = new()

                yield _Site(i, node.lineno, mod.char_col(node), f"'{old_text}' -> '{new_text}'", edits, transform)


def _boolop_swap(mod: _Module) -> Iterator[_Site]:
    for i, node in enumerate(mod.nodes):
        if not isinstance(node, ast.BoolOp) or not mod.ok(node):
            continue
        old_text, new_text = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
        edits: list[Edit] | None = []
        for a, b in zip(node.values, node.values[1:], strict=False):
            where = mod.find_between(mod.span(a)[1], mod.span(b)[0], rf"\b{old_text}\b")
            if where is None:
                edits = None
                break
            edits.append((where[0], where[1], new_text))

        def transform(n: ast.AST) -> None:
            n.op = ast.Or() if isinstance(n.op, ast.And) else ast.And()

        yield _Site(i, node.lineno, mod.char_col(node), f"'{old_text}' -> '{new_text}'", edits, transform)


def _off_by_one(mod: _Module) -> Iterator[_Site]:
    for i, node in enumerate(mod.nodes):
        if not (isinstance(node, ast.Constant) and type(node.value) is int and mod.ok(node)):
            continue
        a, b = mod.span(node)
        for delta in (1, -1):
            new = node.value + delta
            if new < 0:
                continue

            def transform(n: ast.AST, new: int = new) -> None:
                n.value = new

            yield _Site(i, node.lineno, mod.char_col(node), f"{node.value} -> {new}", [(a, b, str(new))], transform)


def _removal(mod: _Module, node: ast.stmt, what: str, i_owner: int, field: str, k: int,
             lines: tuple[int, int] | None = None) -> _Site:
    """A site that drops statement `node` (position k of owner.field); `pass` if the body empties."""
    owner_list = getattr(mod.nodes[i_owner], field)
    empties = len(owner_list) == 1
    lines = lines or mod.whole_lines(node)
    edits: list[Edit] | None
    if lines is not None:
        a, b = mod.lines_span(*lines)
        edits = [(a, b, mod.indent(lines[0]) + "pass" + mod.eol(lines[1]) if empties else "")]
        as_pass = False
    else:
        a, b = mod.span(node)
        edits, as_pass = [(a, b, "pass")], True

    def transform(owner: ast.AST) -> None:
        body = getattr(owner, field)
        if as_pass:
            body[k] = ast.Pass()
        else:
            del body[k]
            if not body:
                body.append(ast.Pass())

    if as_pass:
        return _Site(i_owner, node.lineno, mod.char_col(node), what, edits, transform)
    return _Site(i_owner, node.lineno, mod.char_col(node), what, edits, transform, lines=lines, old=node,
                 replacement=[ast.Pass()] if empties else [])


def _remove_statement(mod: _Module) -> Iterator[_Site]:
    for node in mod.nodes:
        if not isinstance(node, ast.Expr | ast.Assign | ast.AnnAssign | ast.AugAssign) or not mod.infunc(node):
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # docstrings, `...`
        if isinstance(node, ast.AnnAssign) and node.value is None:
            continue
        owner = _owner(mod, node)
        if owner is None:
            continue
        parent, field, k = owner
        yield _removal(mod, node, f"removed statement `{_short(node)}`", mod.index[id(parent)], field, k)


def _remove_loop(mod: _Module) -> Iterator[_Site]:
    for node in mod.nodes:
        if not isinstance(node, ast.For | ast.AsyncFor | ast.While) or not mod.infunc(node):
            continue
        owner = _owner(mod, node)
        if owner is None:
            continue
        parent, field, k = owner
        kind = "while" if isinstance(node, ast.While) else "for"
        yield _removal(mod, node, f"removed {kind} loop at line {node.lineno}", mod.index[id(parent)], field, k)


def _short(node: ast.AST, n: int = 60) -> str:
    try:
        text = ast.unparse(node).split("\n")[0]
    except (ValueError, TypeError, AttributeError, RecursionError):
        return type(node).__name__
    return text if len(text) <= n else text[: n - 3] + "..."


def _starts_with(mod: _Module, node: ast.AST, word: str) -> bool:
    return re.match(rf"{word}\b", mod.text[mod.off(node.lineno, node.col_offset):]) is not None


def _if_shape(mod: _Module, node: ast.If) -> tuple[bool, bool, bool]:
    """(this If is an `elif`, it has a plain `else`, it continues with an `elif`)."""
    parent = mod.parents.get(id(node))
    is_elif = (isinstance(parent, ast.If) and len(parent.orelse) == 1 and parent.orelse[0] is node
               and _starts_with(mod, node, "elif"))
    has_elif = (len(node.orelse) == 1 and isinstance(node.orelse[0], ast.If)
                and _starts_with(mod, node.orelse[0], "elif"))
    return is_elif, bool(node.orelse) and not has_elif, has_elif


def _else_line(mod: _Module, node: ast.If) -> int | None:
    """The line of the `else:` keyword of `node` (None when `else: x` shares its line)."""
    for ln in range(node.orelse[0].lineno - 1, node.body[-1].end_lineno, -1):
        if re.match(r"\s*else\s*:\s*(#.*)?$", mod.line_text(ln)):
            return ln
    return None


def _reindent(mod: _Module, first: int, last: int, old: str, new: str) -> str | None:
    """Lines first..last with leading `old` indentation replaced by `new` (None if a line lacks it)."""
    a, b = mod.lines_span(first, last)
    out = []
    for line in _lines(mod.text[a:b]):
        if not line.strip():
            out.append(line)
        elif line.startswith(old):
            out.append(new + line[len(old):])
        else:
            return None
    return "".join(out)


def _remove_branch(mod: _Module) -> Iterator[_Site]:
    for i, node in enumerate(mod.nodes):
        if not isinstance(node, ast.If) or not mod.infunc(node):
            continue
        is_elif, has_else, has_elif = _if_shape(mod, node)
        else_ln = _else_line(mod, node) if has_else else None
        if not is_elif:
            owner = _owner(mod, node)
            if owner is None:
                continue
            parent, field, k = owner
            i_owner = mod.index[id(parent)]
            if not node.orelse:
                yield _removal(mod, node, f"removed if block at line {node.lineno}", i_owner, field, k)
            else:
                edits: list[Edit] | None = None
                lines = mod.whole_lines(node)
                if lines is not None and has_else and else_ln is not None:
                    body = _reindent(mod, else_ln + 1, node.end_lineno, mod.indent(node.orelse[0].lineno),
                                     mod.indent(node.lineno))
                    if body is not None:
                        edits = [(mod.starts[node.lineno - 1], mod.starts[node.end_lineno], body)]
                elif lines is not None and has_elif:
                    elif_node = node.orelse[0]
                    a = mod.off(elif_node.lineno, elif_node.col_offset)
                    edits = [(mod.starts[node.lineno - 1], a + len("elif"), mod.indent(node.lineno) + "if")]

                def transform(owner: ast.AST, field: str = field, k: int = k) -> None:
                    body = getattr(owner, field)
                    body[k:k + 1] = body[k].orelse

                what = "if block (kept its else)" if has_else else "if block (its elif became if)"
                yield _Site(i_owner, node.lineno, mod.char_col(node), f"removed {what} at line {node.lineno}",
                            edits, transform, lines=lines, old=node,
                            replacement=list(node.orelse) if has_else else [node.orelse[0]])
        else:
            parent = mod.parents[id(node)]
            nxt = node.orelse[0].lineno if has_elif else else_ln if has_else else node.end_lineno + 1
            edits = None
            if nxt is not None and mod.ends_line(node.body[-1]):
                edits = [(mod.starts[node.lineno - 1], mod.starts[nxt - 1], "")]

            def transform(owner: ast.AST) -> None:
                owner.orelse = owner.orelse[0].orelse

            yield _Site(mod.index[id(parent)], node.lineno, mod.char_col(node),
                        f"removed elif branch at line {node.lineno}", edits, transform)
        if has_else:
            edits = None
            if else_ln is not None and mod.ends_line(node.orelse[-1]):
                edits = [mod.lines_span(else_ln, node.end_lineno) + ("",)]

            def drop_else(n: ast.AST) -> None:
                n.orelse = []

            yield _Site(i, else_ln or node.lineno, 0, f"removed else branch of the if at line {node.lineno}",
                        edits, drop_else)


def _swap_if_else(mod: _Module) -> Iterator[_Site]:
    for i, node in enumerate(mod.nodes):
        if isinstance(node, ast.IfExp) and mod.ok(node):
            (a1, b1), (a2, b2) = mod.span(node.body), mod.span(node.orelse)
            edits = [(a1, b1, mod.text[a2:b2]), (a2, b2, mod.text[a1:b1])]

            def swap_exp(n: ast.AST) -> None:
                n.body, n.orelse = n.orelse, n.body

            yield _Site(i, node.lineno, mod.char_col(node), "swapped the values of a conditional expression",
                        edits, swap_exp)
        elif isinstance(node, ast.If) and mod.infunc(node):
            _, has_else, _ = _if_shape(mod, node)
            if not has_else:
                continue
            edits = None
            first_b, first_e = mod.whole_lines(node.body[0]), mod.whole_lines(node.orelse[0])
            last_b, last_e = mod.whole_lines(node.body[-1]), mod.whole_lines(node.orelse[-1])
            if None not in (first_b, first_e, last_b, last_e) and node.body[0].lineno > node.lineno \
                    and _else_line(mod, node) is not None:
                ind_b, ind_e = mod.indent(node.body[0].lineno), mod.indent(node.orelse[0].lineno)
                body_text = _reindent(mod, first_b[0], last_b[1], ind_b, ind_e)
                else_text = _reindent(mod, first_e[0], last_e[1], ind_e, ind_b)
                if body_text is not None and else_text is not None:
                    eb, ee = mod.lines_span(first_b[0], last_b[1]), mod.lines_span(first_e[0], last_e[1])
                    edits = [(eb[0], eb[1], _end_nl(else_text)), (ee[0], ee[1], _end_nl(body_text))]

            def swap(n: ast.AST) -> None:
                n.body, n.orelse = n.orelse, n.body

            yield _Site(i, node.lineno, mod.char_col(node), f"swapped if/else bodies at line {node.lineno}",
                        edits, swap)


def _end_nl(text: str) -> str:
    return text if text.endswith(("\n", "\r")) else text + "\n"


_COMMUTATIVE = {"max", "min"}


def _swap_arguments(mod: _Module) -> Iterator[_Site]:
    for i, node in enumerate(mod.nodes):
        if not isinstance(node, ast.Call) or len(node.args) < 2 or not mod.ok(node):
            continue
        if isinstance(node.func, ast.Name) and node.func.id in _COMMUTATIVE:
            continue
        for k in range(len(node.args) - 1):
            a, b = node.args[k], node.args[k + 1]
            if isinstance(a, ast.Starred) or isinstance(b, ast.Starred) or ast.dump(a) == ast.dump(b):
                continue
            (a1, b1), (a2, b2) = mod.span(a), mod.span(b)
            edits = [(a1, b1, mod.text[a2:b2]), (a2, b2, mod.text[a1:b1])]

            def transform(n: ast.AST, k: int = k) -> None:
                n.args[k], n.args[k + 1] = n.args[k + 1], n.args[k]

            yield _Site(i, node.lineno, mod.char_col(node),
                        f"swapped arguments {k + 1} and {k + 2} of `{_short(node.func, 30)}(...)`", edits, transform)


def _drop_return_value(mod: _Module) -> Iterator[_Site]:
    for i, node in enumerate(mod.nodes):
        if not isinstance(node, ast.Return) or node.value is None or not mod.infunc(node):
            continue
        if isinstance(node.value, ast.Constant) and node.value.value is None:
            continue
        a, b = mod.span(node)  # `return (a +\n b)` -> `return None`, not `return (None)`

        def transform(n: ast.AST) -> None:
            n.value = ast.Constant(value=None)

        yield _Site(i, node.lineno, mod.char_col(node), f"`return {_short(node.value)}` -> `return None`",
                    [(a, b, "return None")], transform)


def _remove_method(mod: _Module) -> Iterator[_Site]:
    for i, node in enumerate(mod.nodes):
        if not isinstance(node, ast.ClassDef) or len(node.body) < 2 or not mod.ok(node):
            continue
        for k, item in enumerate(node.body):
            if not isinstance(item, _FUNCS):
                continue
            lines = mod.whole_lines(item)
            edits, span = None, None
            if lines is not None:
                first, last = lines
                # take the blank lines that separated it from its neighbour along
                if k > 0:
                    while first - 1 > node.body[k - 1].end_lineno and not mod.line_text(first - 1).strip():
                        first -= 1
                else:
                    nxt = node.body[1]
                    start_next = min([nxt.lineno, *(d.lineno for d in getattr(nxt, "decorator_list", []))])
                    while last + 1 < start_next and not mod.line_text(last + 1).strip():
                        last += 1
                edits, span = [mod.lines_span(first, last) + ("",)], (first, last)

            def transform(n: ast.AST, k: int = k) -> None:
                del n.body[k]

            yield _Site(i, item.lineno, mod.char_col(item), f"removed method {node.name}.{item.name}", edits,
                        transform, lines=span, old=item, replacement=[])


_ATOMS = (ast.Name, ast.Attribute, ast.Call, ast.Subscript, ast.Constant, ast.List, ast.Tuple, ast.Dict, ast.Set,
          ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def _negate_condition(mod: _Module) -> Iterator[_Site]:
    for i, node in enumerate(mod.nodes):
        if isinstance(node, ast.IfExp):
            if not mod.ok(node):
                continue
        elif isinstance(node, ast.If | ast.While):
            if not mod.infunc(node):
                continue
        else:
            continue
        test = node.test
        if isinstance(test, ast.Constant):
            continue  # `while True`
        a, b = mod.span(test)
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            inner = mod.seg(test.operand)
            if isinstance(test.operand, ast.IfExp | ast.Lambda | ast.NamedExpr):
                inner = f"({inner})"
            new_text, summary = inner, "dropped `not` from a condition"

            def transform(n: ast.AST) -> None:
                n.test = n.test.operand
        else:
            seg = mod.seg(test)
            new_text = f"not {seg}" if isinstance(test, _ATOMS) else f"not ({seg})"
            summary = f"negated the condition at line {node.lineno}"

            def transform(n: ast.AST) -> None:
                n.test = ast.UnaryOp(op=ast.Not(), operand=n.test)

        yield _Site(i, test.lineno, mod.char_col(test), summary, [(a, b, new_text)], transform)


@dataclass(frozen=True)
class Operator:
    """A mutation operator: `op(source)` yields one Mutation per applicable site."""

    name: str
    description: str
    find: Callable[[_Module], Iterator[_Site]]

    def count_sites(self, source: bytes | str) -> int:
        """How many sites the operator finds in `source` (0 if it does not parse)."""
        mod = _Module.load(source)
        return 0 if mod is None else sum(1 for _ in self.find(mod))

    def __call__(self, source: bytes | str, path: str = "module.py") -> Iterator[Mutation]:
        mod = _Module.load(source)
        if mod is None:
            return
        for site in self.find(mod):
            m = _materialize(mod, site, self.name, path)
            if m is not None:
                yield m


OPERATORS: dict[str, Operator] = {op.name: op for op in (
    Operator("binop_swap", "swap an arithmetic/bitwise operator", _binop_swap),
    Operator("compare_swap", "swap a comparison operator", _compare_swap),
    Operator("boolop_swap", "swap and/or", _boolop_swap),
    Operator("off_by_one", "change an integer literal by one", _off_by_one),
    Operator("remove_statement", "drop an expression statement or assignment", _remove_statement),
    Operator("remove_branch", "drop an if block, an elif branch or an else branch", _remove_branch),
    Operator("remove_loop", "drop a for/while loop", _remove_loop),
    Operator("swap_if_else", "swap the two branches of an if/else", _swap_if_else),
    Operator("swap_arguments", "swap two positional arguments of a call", _swap_arguments),
    Operator("drop_return_value", "return None instead of a value", _drop_return_value),
    Operator("remove_method", "delete a method from a class", _remove_method),
    Operator("negate_condition", "negate the condition of an if/while/conditional expression", _negate_condition),
)}


def site_counts(files: Files, operators: Iterable[str] | None = None) -> dict[str, int]:
    """{operator: number of sites} over the Python files in `files` (before equivalence checks)."""
    names = _operator_names(operators)
    counts = dict.fromkeys(names, 0)
    for path in sorted(files):
        if not path.endswith(".py"):
            continue
        mod = _Module.load(files[path])
        if mod is None:
            continue
        for name in names:
            counts[name] += sum(1 for _ in OPERATORS[name].find(mod))
    return counts


def _operator_names(operators: Iterable[str] | None) -> list[str]:
    names = list(OPERATORS) if operators is None else list(operators)
    unknown = [n for n in names if n not in OPERATORS]
    if unknown:
        raise ValueError(f"unknown mutation operator(s) {unknown}; known: {sorted(OPERATORS)}")
    return names


def candidates(files: Files, *, operators: Iterable[str] | None = None, seed: int = 0, limit: int | None = None,
               per_file: int | None = None) -> list[Mutation]:
    """Mutations of the Python files in `files`: every site of every operator, in a seeded order.

    Sites are enumerated deterministically (files by path, operators in the given
    order, sites in walk order), shuffled with `random.Random(seed)`, and turned into
    mutations in that order, skipping equivalent ones and duplicates, until `limit`
    (and at most `per_file` per file). Files that do not parse are skipped.
    """
    names = _operator_names(operators)
    sites: list[tuple[str, str, _Site]] = []
    mods: dict[str, _Module] = {}
    for path in sorted(files):
        if not path.endswith(".py"):
            continue
        mod = _Module.load(files[path])
        if mod is None:
            continue
        mods[path] = mod
        for name in names:
            sites.extend((path, name, site) for site in OPERATORS[name].find(mod))
    random.Random(seed).shuffle(sites)
    out: list[Mutation] = []
    per: Counter[str] = Counter()
    seen: set[tuple[str, str]] = set()
    for path, name, site in sites:
        if limit is not None and len(out) >= limit:
            break
        if per_file is not None and per[path] >= per_file:
            continue
        m = _materialize(mods[path], site, name, path)
        if m is None or (path, m.mutated) in seen:
            continue
        seen.add((path, m.mutated))
        per[path] += 1
        out.append(m)
    return out


# ---- several bugs at once -------------------------------------------------------------------------


def _changed_regions(original: list[str], mutated: list[str]) -> list[tuple[int, int, list[str]]]:
    sm = difflib.SequenceMatcher(None, original, mutated, autojunk=False)
    return [(i1, i2, mutated[j1:j2]) for tag, i1, i2, j1, j2 in sm.get_opcodes() if tag != "equal"]


def _merge(original: str, versions: list[str]) -> str | None:
    """Apply the line changes of every version of `original` at once; None if any two overlap."""
    orig = _lines(original)
    regions = sorted(r for v in versions for r in _changed_regions(orig, _lines(v)))
    for (a1, a2, _), (b1, b2, _) in zip(regions, regions[1:], strict=False):
        if a2 > b1 or (a2 == b1 and (a1 == a2 or b1 == b2)):
            return None
    out, pos = [], 0
    for i1, i2, rep in regions:
        out.extend(orig[pos:i1])
        if rep and out and not out[-1].endswith(("\n", "\r")):
            return None
        out.extend(rep)
        pos = i2
    out.extend(orig[pos:])
    return "".join(out)


def _base_ops(m: Mutation) -> list[str]:
    return m.operator.removeprefix("multi:").split("+") if m.operator.startswith("multi:") else [m.operator]


def combine(muts: Iterable[Mutation]) -> Mutation | None:
    """Several mutations at once (in different files, or in non-overlapping lines of one file).

    The result's operator is `multi:<op>+<op>...`; `path`/`original`/`mutated` are
    those of the first file, the other files are in `extra` (use `.changes` or
    `.apply(files)` to get them all). None when two of them touch the same lines,
    disagree on a file's original, or the result does not parse or changes nothing.
    """
    muts = list(muts)
    if not muts:
        return None
    if len(muts) == 1:
        return muts[0]
    by_path: dict[str, tuple[str, list[str]]] = {}
    for m in muts:
        for path, (orig, mutated) in m.changes.items():
            if path in by_path and by_path[path][0] != orig:
                return None
            by_path.setdefault(path, (orig, []))[1].append(mutated)
    merged: dict[str, tuple[str, str]] = {}
    for path, (orig, versions) in by_path.items():
        text = _merge(orig, versions)
        if text is None:
            return None
        tree, orig_tree = parse_module(text), parse_module(orig)
        if tree is None or orig_tree is None or ast.dump(tree) == ast.dump(orig_tree):
            return None
        merged[path] = (orig, text)
    first = muts[0]
    paths = list(merged)
    return Mutation(operator="multi:" + "+".join(op for m in muts for op in _base_ops(m)), path=first.path,
                    lineno=first.lineno, col=first.col,
                    summary="; ".join(f"{m.path}:{m.lineno}: {m.summary}" for m in muts),
                    original=merged[first.path][0], mutated=merged[first.path][1], edit="multi",
                    extra=tuple((p, *merged[p]) for p in paths if p != first.path), parts=tuple(muts))
