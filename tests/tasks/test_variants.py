"""Behaviour-preserving variants: rename, reorder, reformat — checked with real pytest runs."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tryloop.tasks.model import Task, TaskMeta, write_files
from tryloop.tasks.mutate import OPERATORS
from tryloop.tasks.variants import (
    KINDS,
    VariantError,
    make_variant,
    reformat,
    rename_identifiers,
    reorder_functions,
)

MODULE = '''\
"""Inventory helpers."""
import math

LIMIT = 10


def total(xs, start=0):
    # running sum
    acc = start
    for x in xs:
        acc += x
    return acc


def scaled(values, factor):
    result = [v * factor for v in values]
    label = f"x{factor}"
    return result, label


class Base:
    kind = "base"

    def describe(self):
        return self.kind


class Stock(Base):
    kind = "stock"

    def __init__(self, items, *, limit=LIMIT):
        self.items = dict(items)
        self.limit = limit

    def add(self, name, count=1):
        current = self.items.get(name, 0)
        if current + count > self.limit:
            raise ValueError(f"too many {name}")
        self.items[name] = current + count
        return self.items[name]

    def mean(self):
        n = len(self.items)
        s = total(self.items.values())

        def per(k):
            return s / k

        return per(n) if n else 0.0

    def spread(self):
        m = self.mean()
        try:
            return math.sqrt(sum((c - m) ** 2 for c in self.items.values()) / len(self.items))
        except ZeroDivisionError as err:
            return str(err)


def area(r):
    return math.pi * r ** 2
'''

TESTS = '''\
import math

import pytest

from inventory import LIMIT, Stock, area, scaled, total


def test_total():
    assert total([1, 2, 3]) == 6
    assert total([1], start=5) == 6


def test_scaled():
    assert scaled([1, 2], 3) == ([3, 6], "x3")


def test_stock():
    s = Stock({"a": 1}, limit=3)
    assert s.add("a") == 2
    assert s.add("b", count=2) == 2
    with pytest.raises(ValueError, match="too many a"):
        s.add("a", 5)
    assert s.describe() == "stock"
    assert s.mean() == 2.0
    assert s.spread() == 0.0
    assert Stock({}).spread() == "division by zero"
    assert Stock({}).limit == LIMIT


def test_area():
    assert math.isclose(area(2), 4 * math.pi)
'''


def run_pytest(root: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120)


def project(root: Path, module: str | bytes) -> Path:
    write_files(root, {"inventory.py": module, "tests/test_inventory.py": TESTS})
    return root


FILES = {"inventory.py": MODULE, "tests/test_inventory.py": TESTS}


def test_rename_identifiers_renames_locals_and_params_only():
    out = rename_identifiers(FILES, seed=1)
    new = out["inventory.py"]
    assert out["tests/test_inventory.py"] == TESTS  # tests are never transformed
    assert new != MODULE
    tree = ast.parse(new)
    top = {getattr(n, "name", None) for n in tree.body}
    assert {"total", "scaled", "Base", "Stock", "area"} <= top  # public names stay
    assert "LIMIT = 10" in new and "# running sum" in new  # formatting and comments stay
    assert "def total(xs, start=0)" not in new and ", start=0)" in new  # `start` is passed by keyword
    assert "def add(self, name, count=1)" in new  # `count` is passed by keyword, `name` is in an f-string
    assert "    current = self.items.get(name, 0)" not in new  # a plain local
    assert "self.items = dict(" in new and "self.limit = " in new  # attributes keep their names
    assert "*, limit=LIMIT" in new  # keyword used by the tests
    assert 'f"x{factor}"' in new and "def scaled(" in new and ", factor)" in new  # used in an f-string
    assert "except ZeroDivisionError as err:" in new and "str(err)" in new  # except-bound
    assert "    acc = start" not in new and "for x in xs:" not in new
    assert rename_identifiers(FILES, seed=1) == out  # deterministic
    assert rename_identifiers(FILES, seed=2)["inventory.py"] != new


def test_reorder_functions_respects_definition_time_needs():
    for seed in range(8):
        new = reorder_functions(FILES, seed=seed)["inventory.py"]
        tree = ast.parse(new)
        names = [n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)]
        assert sorted(names) == sorted(["total", "scaled", "Base", "Stock", "area"])
        assert names.index("Base") < names.index("Stock")  # a base class comes first
        assert new.index('"""Inventory helpers."""') == 0 and new.index("import math") < new.index("def ")
        assert "    # running sum\n    acc = start" in new
    orders = {tuple(n.name for n in ast.parse(reorder_functions(FILES, seed=s)["inventory.py"]).body
                    if isinstance(n, ast.FunctionDef | ast.ClassDef)) for s in range(8)}
    assert len(orders) > 2


def test_reorder_keeps_statements_and_registering_decorators_in_place():
    src = ("import functools\n\nREG = []\n\n\ndef register(f):\n    REG.append(f.__name__)\n    return f\n\n\n"
           "@register\ndef a():\n    return 1\n\n\n@register\ndef b():\n    return 2\n\n\nX = a()\n\n\n"
           "@functools.lru_cache\ndef c():\n    return 3\n\n\ndef d():\n    return 4\n")
    for seed in range(6):
        new = reorder_functions({"m.py": src}, seed)["m.py"]
        assert new.index("def a") < new.index("def b") < new.index("X = a()")  # registration order
        assert new.index("X = a()") < new.index("def c") and new.index("X = a()") < new.index("def d")
        assert sorted(ast.dump(s) for s in ast.parse(new).body) == sorted(ast.dump(s) for s in ast.parse(src).body)


def test_reformat_normalizes_and_keeps_the_ast():
    new = reformat(FILES)["inventory.py"]
    assert "# running sum" not in new and "f'x{factor}'" in new
    assert ast.dump(ast.parse(new)) == ast.dump(ast.parse(MODULE))
    assert reformat({"m.py": b"x = ( 1 +2 )\n"})["m.py"] == b"x = 1 + 2\n"  # bytes in, bytes out


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_variants_keep_a_real_test_suite_passing(tmp_path, kind):
    assert run_pytest(project(tmp_path / "orig", MODULE)).returncode == 0
    transform = {"rename": rename_identifiers, "reorder": reorder_functions, "reformat": reformat}[kind]
    for seed in (0, 1, 2):
        new = transform(FILES, seed)["inventory.py"]
        assert new != MODULE
        res = run_pytest(project(tmp_path / f"{kind}{seed}", new))
        assert res.returncode == 0, res.stdout[-3000:]


def _mutation_task(tmp_path: Path) -> Task:
    m = next(m for m in OPERATORS["binop_swap"](MODULE, "inventory.py") if m.summary == "'+' -> '-'"
             and "current + count >" in MODULE.splitlines()[m.lineno - 1])
    meta = TaskMeta(id="inventory/binop-1", family="inventory-1", project="inventory", source="mutation",
                    split="eval", tags=["mutation"], fail_to_pass=["tests/test_inventory.py::test_stock"],
                    origin={"operator": m.operator})
    return Task.create(tmp_path / "parent", meta, "`test_stock` fails.\n",
                       workspace={"inventory.py": m.mutated, "README.md": "inventory\n"},
                       tests={"tests/test_inventory.py": TESTS}, solution={"inventory.py": m.original})


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_make_variant_transforms_workspace_and_solution_alike(tmp_path, kind):
    parent = _mutation_task(tmp_path)
    v = make_variant(parent, tmp_path / "variant", kind, seed=3)
    assert v.id == f"inventory/binop-1-v{kind}3"
    assert v.meta.source == "variant" and v.meta.family == parent.meta.family and v.meta.split == "eval"
    assert v.meta.origin == {"parent": parent.id, "parent_fingerprint": parent.fingerprint(), "kind": kind,
                             "seed": 3, "parent_origin": {"operator": "binop_swap"}}
    assert v.meta.fail_to_pass == parent.meta.fail_to_pass and v.instruction == parent.instruction
    assert v.hidden_tests() == parent.hidden_tests()
    ws, sol = v.workspace_files(), v.solution_files()
    assert ws["README.md"] == b"inventory\n"
    assert sol["inventory.py"] != parent.solution_files()["inventory.py"]
    assert ws["inventory.py"] != sol["inventory.py"]
    # the bug is still the only difference between workspace and solution
    ws_lines, sol_lines = ws["inventory.py"].decode().splitlines(), sol["inventory.py"].decode().splitlines()
    assert len(ws_lines) == len(sol_lines)
    assert sum(a != b for a, b in zip(ws_lines, sol_lines, strict=True)) == 1
    # broken workspace fails, solution passes: the same as the parent
    broken = run_pytest(project(tmp_path / "broken", ws["inventory.py"]))
    fixed = run_pytest(project(tmp_path / "fixed", sol["inventory.py"]))
    assert broken.returncode == 1 and "test_stock" in broken.stdout
    assert fixed.returncode == 0, fixed.stdout[-3000:]
    assert Task.load(v.root).fingerprint() == v.fingerprint()


def test_make_variant_refuses_a_no_op_and_unknown_kinds(tmp_path):
    meta = TaskMeta(id="tiny/t", family="tiny", project="tiny", source="mutation")
    task = Task.create(tmp_path / "tiny", meta, "x\n", workspace={"m.py": "X = 2\n"},
                       tests={"tests/test_m.py": "from m import X\n\n\ndef test_x():\n    assert X == 1\n"},
                       solution={"m.py": "X = 1\n"})
    with pytest.raises(VariantError, match="changes nothing"):
        make_variant(task, tmp_path / "v", "rename", seed=0)
    with pytest.raises(ValueError, match="unknown variant kind"):
        make_variant(task, tmp_path / "v", "shuffle", seed=0)
