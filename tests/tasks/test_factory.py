"""The factory end to end: real mutations, real gate runs in real sandboxes, the store."""

from __future__ import annotations

import pytest

from tryloop.tasks.factory import (
    BuildOptions,
    build_default,
    bundled_projects,
    code_substeps,
    multifile_bugs,
    multifile_task,
    synthesize,
)
from tryloop.tasks.gate import GateConfig, GateReport
from tryloop.tasks.splits import check_leakage
from tryloop.tasks.store import TaskStore


def project(name: str):
    return next(p for p in bundled_projects() if p.name == name)


async def test_synthesized_bugs_pass_the_gate_with_bug_report_instructions(runtime, tmp_path):
    store = TaskStore(tmp_path / "store")
    report = GateReport()
    kept = await synthesize(runtime, store, project("strutils"), tmp_path / "work", keep=2, seed=3,
                            gate=GateConfig(k=2, require_pass_to_pass=True), report=report, max_candidates=12,
                            eval_fraction=0.5)
    assert len(kept) == 2, report.rejected
    for entry in kept:
        task = store.get(entry.fingerprint)
        m = task.meta
        assert m.source == "mutation" and m.fail_to_pass and m.pass_to_pass
        assert m.split in ("train", "eval") and m.tier and m.difficulty is not None
        assert m.origin["operator"] and m.origin["path"]
        # The instruction reads like a bug report: a failing test named, the fix never shown.
        assert any(t.split("::")[-1] in task.instruction for t in m.fail_to_pass)
        changed = task.solution_files()
        ws = task.workspace_files()
        for path, fixed in changed.items():
            fixed_lines = set(fixed.decode().splitlines()) - set(ws[path].decode().splitlines())
            for line in fixed_lines:
                if len(line.strip()) > 8:
                    assert line.strip() not in task.instruction
        # Hidden parts never enter the workspace.
        assert not any(p.startswith("tests/") for p in ws)
    assert report.total_kept == 2 and sum(report.kept.values()) == 2


async def test_synthesized_bugs_can_declare_the_code_sub_steps(runtime, tmp_path):
    store = TaskStore(tmp_path / "store")
    report = GateReport()
    kept = await synthesize(runtime, store, project("strutils"), tmp_path / "work", keep=1, seed=3,
                            gate=GateConfig(k=2, require_pass_to_pass=True), report=report, max_candidates=12,
                            substeps=code_substeps())
    assert len(kept) == 1, report.rejected
    task = store.get(kept[0].fingerprint)
    assert [(s.name, s.check, s.weight) for s in task.meta.substeps.steps] == [("repro", "repro", 1.0),
                                                                               ("fix", "tests", 3.0)]
    assert task.meta.substeps.track
    # The bug report, then what the repro sub-step asks (a test outside the protected tests/).
    assert "reproduces the bug" in task.instruction and "outside `tests/`" in task.instruction


async def test_multifile_bug_passes_the_gate(runtime, tmp_path):
    bug = multifile_bugs()[0]
    task = multifile_task(project(bug["project"]), bug, tmp_path)
    assert len(task.solution_files()) >= 2
    from tryloop.tasks.gate import validate

    res = await validate(runtime, task, GateConfig(k=2, require_pass_to_pass=True))
    assert res.accepted, res


@pytest.mark.slow
async def test_build_default_small_is_gated_split_and_leak_free(runtime, tmp_path):
    store = TaskStore(tmp_path / "store")
    report = await build_default(runtime, store, tmp_path / "work",
                                 BuildOptions(per_project=1, humaneval=3, data_per_family=1, docs_per_family=1,
                                              ops_per_family=1, gate=GateConfig(k=2)))
    entries = store.query()
    assert report.total_kept == len(entries) >= 8 + 24 + 12 + 14
    assert {e.meta.source for e in entries} >= {"humaneval", "mutation", "bundled", "variant", "data", "docs", "ops"}
    for v in (e for e in entries if e.meta.source == "variant"):
        parent = store.get(v.meta.origin["parent_fingerprint"])
        assert parent.meta.family == v.meta.family and parent.meta.split == v.meta.split
    assert {e.meta.tier for e in entries} >= {"easy", "hard"}
    assert all(e.meta.split for e in entries)
    assert check_leakage(store).clean
