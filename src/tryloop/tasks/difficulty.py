"""Difficulty: a static estimate first, refined by measured pass rates.

Static features: how many files the fix touches, how many lines change, how
large the workspace is and how many tests fail. Measured pass rates of a policy
(recorded per task version in the store) override the estimate once there are
enough attempts.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from tryloop.tasks.model import Task

TIERS = ("easy", "medium", "hard")


@dataclass(frozen=True)
class Features:
    files_changed: int
    lines_changed: int
    workspace_lines: int
    failing_tests: int
    function_level: bool

    @classmethod
    def of(cls, task: Task) -> Features:
        ws = task.workspace_files()
        changed = lines = 0
        for rel, after in task.solution_files().items():
            before = ws.get(rel, b"").decode("utf-8", "replace").splitlines()
            diff = [d for d in difflib.unified_diff(before, after.decode("utf-8", "replace").splitlines(), n=0)
                    if d[:1] in "+-" and not d.startswith(("+++", "---"))]
            if diff:
                changed += 1
                lines += len(diff)
        src_lines = sum(len(d.splitlines()) for r, d in ws.items() if r.endswith(".py"))
        return cls(changed, lines, src_lines, len(task.meta.fail_to_pass),
                   task.meta.source == "humaneval" or "function" in task.meta.tags)


def static_difficulty(task: Task) -> tuple[float, str]:
    """A score in [0, 1] and its tier."""
    if task.meta.grader == "answer" and task.meta.tier:
        # Answer-graded families (data, documents) are tiered by their templates: there is no fix to measure.
        return {"easy": 0.2, "medium": 0.45, "hard": 0.7}[task.meta.tier], task.meta.tier
    f = Features.of(task)
    if f.function_level:
        score = 0.1 + min(0.2, f.lines_changed / 100)
    else:
        score = (0.25 * min(1.0, (f.files_changed - 1) / 2)      # multi-file fixes are hard
                 + 0.25 * min(1.0, f.workspace_lines / 800)      # more code to read
                 + 0.2 * min(1.0, f.lines_changed / 20)
                 + 0.1 * (1.0 - min(1.0, f.failing_tests / 5))   # fewer failing tests: less signal
                 + 0.2 * (f.files_changed >= 2))
        score = 0.2 + 0.8 * score
    score = round(min(1.0, score), 3)
    tier = "easy" if score < 0.35 else "medium" if score < 0.6 else "hard"
    return score, tier


def measured_tier(rate: float) -> str:
    """Tier from a policy's measured pass rate."""
    return "easy" if rate >= 0.5 else "medium" if rate >= 0.1 else "hard"


def refine_from_pass_rates(store, policy: str, min_attempts: int = 8) -> int:
    """Replace static tiers by measured ones where a policy has enough attempts; returns
    how many tasks changed."""
    changed = 0
    for e in store.query(latest=False):
        rate = store.pass_rates(e.fingerprint).get(policy)
        if not rate or rate["attempts"] < min_attempts:
            continue
        tier, difficulty = measured_tier(rate["rate"]), round(1.0 - rate["rate"], 3)
        if (tier, difficulty) != (e.meta.tier, e.meta.difficulty):
            store.update_meta(e.fingerprint, tier=tier, difficulty=difficulty)
            changed += 1
    return changed
