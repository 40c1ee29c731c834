"""Task families beyond code, graded by their answer file (see `check` and tryloop.rewards.answers).

    data       data analysis over seeded messy files: a typed answer, recomputed gold
    documents  structured extraction: a JSON document valid against a schema, scored per field
    ops        a broken service with a planted fault: judged by end state in a fresh sandbox

`synthesize(family, dest, ...)` makes a family's candidates; `gate.validate_answer`
is their quality gate.
"""

from __future__ import annotations

from pathlib import Path

from tryloop.tasks.model import Task

FAMILIES = ("data", "docs", "ops")


def synthesize(family: str, dest: str | Path, *, count: int | None = None, per_family: int = 3, seed: int = 0,
               tier: int | None = None) -> list[Task]:
    """Candidates of `family` (data | docs | ops), written under `dest` (not yet gated)."""
    if family == "data":
        from tryloop.tasks.families.data import data_tasks

        return data_tasks(dest, count=count, per_family=per_family, seed=seed, tier=tier)
    if family == "docs":
        from tryloop.tasks.families.documents import document_tasks

        return document_tasks(dest, count=count, per_family=per_family, seed=seed, tier=tier)
    if family == "ops":
        from tryloop.tasks.families.ops import ops_tasks

        return ops_tasks(dest, count=count, per_family=per_family, seed=seed, tier=tier)
    raise ValueError(f"unknown task family {family!r}; known: {', '.join(FAMILIES)}")
