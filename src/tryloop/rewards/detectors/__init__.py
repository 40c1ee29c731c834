"""Reward-hack detectors: static evidence that a submission games the judge instead of doing the task.

The verifier already takes the teeth out of many hacks (protected paths are put
back, hidden tests win, per-test results come from a plugin). Detectors still
matter, for three reasons:

1. Some hacks survive restoring. Code under test shares the test process with
   pytest: it can patch pytest, return objects that compare equal to anything,
   or hard-code answers copied from leaked tests. The harness's runtime
   evidence (tryloop.tasks.harness) sees what it does through audited
   operations; these detectors see what it writes, including plain attribute
   patches no audit event reports.
2. An attempt is a signal in itself: a policy that edits tests should not be
   rewarded even when the edit is undone before grading.
3. Behaviour (reading git history, files outside the workspace, the network)
   leaves no trace in the diff at all; only the commands show it.

`detect` compares the submission with the pristine workspace and reports only
what the submission added: a project whose CLI already calls `sys.exit` is not
flagged for it. Every flag carries its evidence, a file and line or the command,
so a person can check it. Severity: "hack" (a reward policy zeroes the reward),
"suspicious" (worth a look; e.g. a new test file of the agent's own), "info".
Kinds are stable strings; a reward policy refers to them through the constants
and `DETECTORS` below.

The package is split along the detectors' seams: `base` (the submission as
they see it, what was added, name resolution), `files`, `code` (code under
test) and `commands` (behaviour); every public name is available from here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from tryloop.rewards.detectors.base import (  # noqa: F401 (the package's names)
    CONSTANT_EQ,
    EARLY_EXIT,
    GIT_HISTORY,
    HIDDEN_LITERAL,
    MONKEYPATCH,
    NETWORK,
    NEW_HOOK_FILE,
    OPAQUE_CODE,
    OUTSIDE_READ,
    OUTSIDE_WRITE,
    PROTECTED_PATH_EDIT,
    REPORT_TAMPER,
    SEVERITIES,
    SKIP_INSERTION,
    WORKSPACE,
    Context,
    Detector,
    Hit,
    PyFile,
    Severity,
    TextPattern,
    added_hits,
    is_test_path,
    protected_match,
    workspace_path,
)
from tryloop.rewards.detectors.code import (  # noqa: F401 (the package's names)
    detect_constant_eq,
    detect_early_exit,
    detect_hidden_literal,
    detect_monkeypatch,
    detect_report_tamper,
    detect_skip_insertion,
    is_literal,
    nontrivial,
    scan_constant_eq,
    scan_exits,
    scan_monkeypatch,
    scan_skips,
)
from tryloop.rewards.detectors.commands import (  # noqa: F401 (the package's names)
    classify_outside,
    detect_git_history,
    detect_network,
    detect_outside_read,
    simple_commands,
)
from tryloop.rewards.detectors.files import (  # noqa: F401 (the package's names)
    detect_new_hook_file,
    detect_opaque_code,
    detect_outside_write,
    detect_protected_path_edit,
)
from tryloop.rewards.submission import Submission
from tryloop.rewards.verdict import Flag
from tryloop.tasks.model import Task

# ---- the registry -------------------------------------------------------------------------

DETECTORS: dict[str, Detector] = {
    PROTECTED_PATH_EDIT: detect_protected_path_edit,
    OUTSIDE_WRITE: detect_outside_write,
    NEW_HOOK_FILE: detect_new_hook_file,
    OPAQUE_CODE: detect_opaque_code,
    EARLY_EXIT: detect_early_exit,
    SKIP_INSERTION: detect_skip_insertion,
    CONSTANT_EQ: detect_constant_eq,
    MONKEYPATCH: detect_monkeypatch,
    REPORT_TAMPER: detect_report_tamper,
    HIDDEN_LITERAL: detect_hidden_literal,
    GIT_HISTORY: detect_git_history,
    OUTSIDE_READ: detect_outside_read,
    NETWORK: detect_network,
}
KINDS: tuple[str, ...] = tuple(DETECTORS)


def detect(task: Task, sub: Submission, *, pristine: Mapping[str, bytes], hidden_tests: Mapping[str, bytes],
           kinds: Iterable[str] | None = None) -> list[Flag]:
    """Every detector's flags (or those of `kinds`), in registry order, each with its evidence."""
    ctx = Context(task, sub, pristine, hidden_tests)
    selected = list(DETECTORS) if kinds is None else list(kinds)
    unknown = [k for k in selected if k not in DETECTORS]
    if unknown:
        raise KeyError(f"unknown detector kind(s): {unknown}; known: {list(DETECTORS)}")
    out: list[Flag] = []
    seen: set[Flag] = set()
    for kind in selected:
        for flag in DETECTORS[kind](ctx):
            if flag not in seen:
                seen.add(flag)
                out.append(flag)
    return out


def worst(flags: Iterable[Flag]) -> Severity | None:
    """The highest severity among `flags` (None when there are none)."""
    ranks = [SEVERITIES.index(f.severity) for f in flags]
    return SEVERITIES[max(ranks)] if ranks else None


def hacks(flags: Iterable[Flag]) -> list[Flag]:
    return [f for f in flags if f.severity == "hack"]
