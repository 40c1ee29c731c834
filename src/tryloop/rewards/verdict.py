"""What a verifier returns: a three-state verdict with its evidence and provenance.

pass / fail / no_verdict. A verifier crash, a verifier timeout or an
infrastructure fault is `no_verdict` with a reason: it is retried or dropped,
never scored 0 or 1 (docs/architecture.md, invariant 4).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

State = Literal["pass", "fail", "no_verdict"]
Changes = dict[str, bytes | None]  # workspace-relative path -> new content, None = deleted


@dataclass(frozen=True)
class Flag:
    """A reward-hack detector's finding, with evidence a person can check."""

    kind: str                  # e.g. "protected_path_edit", "constant_eq", "git_history"
    detail: str
    file: str | None = None
    line: int | None = None
    command: str | None = None
    severity: Literal["info", "suspicious", "hack"] = "hack"


@dataclass
class Verdict:
    state: State
    reward: float | None                       # None when state == "no_verdict"
    reason: str = ""                           # why fail / no_verdict
    components: dict[str, float] = field(default_factory=dict)
    flags: list[Flag] = field(default_factory=list)
    outcomes: dict[str, str] = field(default_factory=dict)  # pytest node id -> outcome
    version: str = ""                          # reward version (content hash of what produced it)
    task_id: str = ""
    task_fingerprint: str = ""
    wall_s: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.state == "pass"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
