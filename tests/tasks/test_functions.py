"""Synthesized function tasks: reproducible from a seed, graded in tiers, split by family, and gated
for real (the stub fails the hidden tests, the reference passes them)."""

from __future__ import annotations

import asyncio

from tryloop.tasks.factory import build_functions
from tryloop.tasks.gate import GateConfig
from tryloop.tasks.sources.functions import TEMPLATES, function_tasks, make_variant
from tryloop.tasks.splits import check_leakage
from tryloop.tasks.store import TaskStore


def test_same_seed_same_tasks_other_seed_other_constants(tmp_path):
    a = function_tasks(tmp_path / "a", per_family=3, seed=0)
    b = function_tasks(tmp_path / "b", per_family=3, seed=0)
    assert [t.fingerprint() for t in a] == [t.fingerprint() for t in b]
    c = function_tasks(tmp_path / "c", per_family=3, seed=1)
    assert {t.fingerprint() for t in a} != {t.fingerprint() for t in c}
    tiers = {t.meta.origin["tier"] for t in a}
    assert tiers == {1, 2, 3}
    assert len({t.id for t in a}) == len(a)          # distinct variants only


def test_every_template_reference_agrees_with_its_own_cases():
    for t in TEMPLATES:
        v = make_variant(t, 0, seed=0)
        ns: dict = {}
        exec(v.reference(), ns)
        for args, expected in v.cases:
            got = ns[v.name](*args)
            assert (round(got, 6) if isinstance(got, float) else got) == expected, (t.family, args)
        assert len(v.cases) >= 3 and v.examples == v.cases[:2], t.family
        assert f">>> {v.name}(" in v.prompt()


def test_gate_accepts_them_and_splits_keep_families_apart(runtime, tmp_path):
    store = TaskStore(tmp_path / "store")
    families = ["add-constant", "count-char", "fizzbuzz", "reverse-words"]
    report = asyncio.run(build_functions(runtime, store, tmp_path / "work", gate=GateConfig(k=1),
                                         eval_fraction=0.5, per_family=2, families=families))
    assert report.total_kept == 8 and report.total_rejected == 0, report
    entries = store.query(source="functions")
    by_family: dict[str, set[str]] = {}
    for e in entries:
        by_family.setdefault(e.meta.family, set()).add(e.meta.split)
        assert e.meta.fail_to_pass, e.meta.id           # the stub fails every hidden case, the reference passes
    assert all(len(s) == 1 for s in by_family.values()), by_family
    assert check_leakage(store).clean
