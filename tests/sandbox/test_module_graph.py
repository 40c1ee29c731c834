"""The sandbox package's modules form no import cycle, not even through type-only or
function-level imports: a lower module declares what it needs of a higher one as a
Protocol (files.FileRoot, process.CommandHost, sandbox.SandboxOwner)."""

from __future__ import annotations

import ast
from pathlib import Path

import tryloop.sandbox

PACKAGE = Path(tryloop.sandbox.__file__).parent


def _imports(path: Path) -> set[str]:
    """Modules of the package that `path` imports anywhere (top level, TYPE_CHECKING, functions)."""
    names = {p.stem for p in PACKAGE.glob("*.py")}
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "tryloop.sandbox":
                out |= {a.name for a in node.names if a.name in names}
            elif node.module.startswith("tryloop.sandbox."):
                out.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            out |= {a.name.split(".")[2] for a in node.names if a.name.startswith("tryloop.sandbox.")}
    out.discard(path.stem)
    return out


def test_no_import_cycles_in_the_sandbox_package():
    graph = {p.stem: _imports(p) for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    cycles: list[list[str]] = []

    def visit(start: str, node: str, path: list[str]) -> None:
        for nxt in sorted(graph.get(node, ())):
            if nxt == start:
                cycles.append(path + [nxt])
            elif nxt not in path and nxt > start:  # each cycle once, from its smallest module
                visit(start, nxt, path + [nxt])

    for module in sorted(graph):
        visit(module, module, [module])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)
