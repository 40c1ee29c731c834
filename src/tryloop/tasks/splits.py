"""Train / eval splits by family and source project, and the leakage check.

A task's split group is its source project — every task made from one project
lands in one split — except for collections of independent problems (HumanEval),
where it is the family. Variants share their origin's family and project, so
they can never land in a split other than their origin's.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from tryloop.tasks.dedup import near_duplicate_key
from tryloop.tasks.model import Task, TaskMeta
from tryloop.tasks.store import Entry, TaskStore

INDEPENDENT_SOURCES = {"humaneval", "functions", "data", "docs", "ops"}  # split by family (template)


def split_group(meta: TaskMeta) -> str:
    return f"family:{meta.family}" if meta.source in INDEPENDENT_SOURCES or meta.project in INDEPENDENT_SOURCES \
        else f"project:{meta.project}"


def assign_split(meta: TaskMeta, eval_fraction: float, seed: int = 0) -> str:
    """Deterministic: a hash of the group decides, so a rebuilt store splits the same way."""
    h = hashlib.sha256(f"{seed}:{split_group(meta)}".encode()).digest()
    return "eval" if int.from_bytes(h[:8], "big") / 2**64 < eval_fraction else "train"


def eval_share(source: str | None, eval_fraction: float, by_source: dict[str, float] | None) -> float:
    """The held-out share of a source's split groups: its own in `by_source`, else `eval_fraction`."""
    return (by_source or {}).get(source or "", eval_fraction)


def apply_splits(store: TaskStore, eval_fraction: float = 0.2, seed: int = 0, *,
                 overwrite: bool = False, by_source: dict[str, float] | None = None) -> dict[str, int]:
    """Split every unsplit task (every task with `overwrite`); `by_source` overrides the share per source."""
    counts = {"train": 0, "eval": 0}
    for e in store.query(latest=False):
        share = eval_share(e.meta.source, eval_fraction, by_source)
        split = e.meta.split if (e.meta.split and not overwrite) else assign_split(e.meta, share, seed)
        if split != e.meta.split:
            store.update_meta(e.fingerprint, split=split)
        counts[split] += 1
    return counts


@dataclass
class LeakageReport:
    shared_groups: list[str] = field(default_factory=list)       # a project/family in both splits
    shared_families: list[str] = field(default_factory=list)
    duplicate_fingerprints: list[str] = field(default_factory=list)
    near_duplicates: list[tuple[str, str]] = field(default_factory=list)  # (train id, eval id)
    unsplit: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not (self.shared_groups or self.shared_families or self.duplicate_fingerprints
                    or self.near_duplicates)

    def lines(self) -> list[str]:
        out = [f"group in both splits: {g}" for g in self.shared_groups]
        out += [f"family in both splits: {f}" for f in self.shared_families]
        out += [f"same task version in both splits: {fp[:12]}" for fp in self.duplicate_fingerprints]
        out += [f"near-duplicate across splits: {a} ~ {b}" for a, b in self.near_duplicates]
        return out


def check_leakage(store: TaskStore, tasks: dict[str, Task] | None = None) -> LeakageReport:
    """Any overlap between train and eval: groups, families, identical or near-identical tasks."""
    entries = store.query(latest=False)
    rep = LeakageReport(unsplit=sorted(e.id for e in entries if e.meta.split is None))
    by_split: dict[str, list[Entry]] = {"train": [], "eval": []}
    for e in entries:
        if e.meta.split in by_split:
            by_split[e.meta.split].append(e)
    groups = {s: {split_group(e.meta) for e in es} for s, es in by_split.items()}
    fams = {s: {e.meta.family for e in es} for s, es in by_split.items()}
    fps = {s: {e.fingerprint for e in es} for s, es in by_split.items()}
    rep.shared_groups = sorted(groups["train"] & groups["eval"])
    rep.shared_families = sorted(fams["train"] & fams["eval"])
    rep.duplicate_fingerprints = sorted(fps["train"] & fps["eval"])
    keys: dict[str, dict[str, str]] = {"train": {}, "eval": {}}
    for s, es in by_split.items():
        for e in es:
            task = (tasks or {}).get(e.fingerprint) or store.get(e.fingerprint)
            k = near_duplicate_key(task)
            if k:
                keys[s].setdefault(k, e.id)
    for k, eval_id in keys["eval"].items():
        if k in keys["train"]:
            rep.near_duplicates.append((keys["train"][k], eval_id))
    return rep
