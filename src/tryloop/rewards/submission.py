"""What the verifier judges: the agent's final workspace as a diff, plus what it did.

The diff is taken from the agent's sandbox after the episode (or built by hand in
tests and red-team suites); the verifier never looks inside the agent's sandbox
itself. `commands` and `reads` come from the episode's tool calls, for the
detectors that look at behaviour rather than files (git history, network,
reading outside the workspace).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tryloop.rewards.verdict import Changes


@dataclass
class Submission:
    changes: Changes = field(default_factory=dict)   # workspace-relative path -> new bytes, None = deleted
    commands: list[str] = field(default_factory=list)  # shell commands the agent ran, in order
    reads: list[str] = field(default_factory=list)     # paths the agent asked to view (as given)
    # Efficiency figures for composite rewards: turns, completion tokens, wall seconds, tool errors.
    metrics: dict[str, float] = field(default_factory=dict)
    answer: str = ""                                   # the agent's final message (for a judge)
    meta: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_files(cls, files: dict[str, bytes | str], **kw: Any) -> Submission:
        return cls(changes={k: v.encode() if isinstance(v, str) else v for k, v in files.items()}, **kw)
