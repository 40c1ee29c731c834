"""A reward spec: weighted components, a flag policy, an optional judge — declared, not coded.

    components:
      - {name: correctness, kind: tests, weight: 1.0}
      - {name: quality, kind: compiles, weight: 0.1}
      - {name: brevity, kind: diff_size, weight: 0.05, budget: 200}
    flag_policy: {hack: zero, suspicious: record}

Every component is recorded unweighted beside the total (`Verdict.components`),
so a change of weights is a `total()` away, never a re-run. The spec is part of
the reward version: change a weight and the version changes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from tryloop._model import _Model

ComponentKind = Literal[
    "tests",        # 1 when every expected test passed (fraction of them with partial_credit)
    "compiles",     # 1 when every changed .py file compiles
    "contracts",    # fraction of the task's public signatures that still exist
    "lint",         # 1 - (lint findings / budget), floored at 0, on changed files (ruff, when installed)
    "judge",        # model-as-judge score in [0, 1] (needs `judge`)
    "turns",        # efficiency: 1 - turns / budget
    "tokens",       # efficiency: 1 - completion tokens / budget
    "wall_time",    # efficiency: 1 - seconds / budget
    "tool_errors",  # penalty: -(malformed or failed tool calls) / budget, floored at -1
    "diff_size",    # penalty: -(changed lines) / budget, floored at -1
]
FlagAction = Literal["record", "penalize", "zero", "mask"]
ACTION_ORDER: dict[str, int] = {"record": 0, "penalize": 1, "zero": 2, "mask": 3}

# Components that are efficiency scores or penalties take their value from the
# submission's metrics under these names.
METRIC_OF = {"turns": "turns", "tokens": "tokens", "wall_time": "wall_s", "tool_errors": "tool_errors"}


class Component(_Model):
    name: str = Field(description="label in reports and in Verdict.components")
    kind: ComponentKind
    weight: float = Field(1.0, description="weight in the total; negative weights are allowed")
    budget: float = Field(1.0, gt=0, description="scale of efficiency and penalty components")


class RewardSpec(_Model):
    """How a verdict becomes a number. Flags act by the policy: kind first, then severity.

    This is the only flag policy: the verifier applies it once (zero, penalize) and marks the
    verdict (mask); training uses the stored reward and the mark as they are."""

    components: list[Component] = Field(
        default_factory=lambda: [Component(name="correctness", kind="tests", weight=1.0),
                                 Component(name="compiles", kind="compiles", weight=0.1)],
        description="weighted components; the total is their weighted sum")
    partial_credit: bool = Field(False, description="tests component = fraction of expected tests passed")
    flag_policy: dict[str, FlagAction] = Field(
        default_factory=lambda: {"hack": "zero", "suspicious": "record", "info": "record"},
        description="detector kind or severity -> record | penalize | zero | mask")
    gate_on_tests: bool = Field(False, description="quality and efficiency components count only when the "
                                                    "tests pass (penalties always count)")
    flag_penalty: float = Field(0.5, ge=0, description="subtracted from the total per 'penalize' flag")
    contracts: list[str] | None = Field(
        None, description="'module.path:name' signatures that must survive; None = the public "
                          "functions and classes of the files the agent changed")
    judge: dict | None = Field(None, description="JudgeConfig fields for a 'judge' component")
    timeout_s: float | None = Field(None, gt=0, description="verifier wall-clock limit (default: the task's test timeout)")
    decoys: bool = Field(True, description="when tests pass, run them again with their expected values changed: "
                                           "a test that still passes is `expected_read` evidence (tryloop.rewards.decoys)")

    def needs(self, kind: ComponentKind) -> bool:
        return any(c.kind == kind for c in self.components)

    def total(self, components: dict[str, float]) -> float:
        """Weighted sum of recorded component values (missing ones count 0)."""
        return sum(c.weight * components.get(c.name, 0.0) for c in self.components)

    def action_for(self, kind: str, severity: str) -> FlagAction:
        return self.flag_policy.get(kind) or self.flag_policy.get(severity) or "record"

    def worst_action(self, flags: Iterable[Mapping[str, object] | Any]) -> tuple[FlagAction, str | None]:
        """The most severe action any flag asks for (record < penalize < zero < mask), and the
        kind of the flag that asked. Flags are `Flag`s or their dicts."""
        action: FlagAction = "record"
        by: str | None = None
        for f in flags:
            kind, severity = (str(f.get("kind", "")), str(f.get("severity", "hack"))) if isinstance(f, Mapping) \
                else (f.kind, f.severity)
            a = self.action_for(kind, severity)
            if by is None or ACTION_ORDER[a] > ACTION_ORDER[action]:
                action, by = a, kind
        return action, by


class RewardsConfig(_Model):
    """`rewards:` in the YAML file: the spec, and where the gold set and the gate's records live."""

    spec: RewardSpec = Field(default_factory=RewardSpec)
    gold_path: Path = Field(Path("/var/lib/tryloop/rewards/gold.jsonl"), description="gold set (JSONL)")
    gate_dir: Path = Field(Path("/var/lib/tryloop/rewards/gate"), description="regression gate records")
    labels_path: Path = Field(Path("/var/lib/tryloop/rewards/labels.jsonl"), description="spot-check labels")
    gate_per_family: int = Field(1, ge=1, description="tasks per family whose built-in gold items the gate uses")
    gate_families: int | None = Field(3, ge=1, description="at most this many families in the gate "
                                                              "(None: all); sampled by fingerprint, stable")
    concurrency: int = Field(2, ge=1, description="verifier runs at once")
    spot_check_uniform: int = Field(5, ge=0, description="`reward spot-check`: uniformly sampled items "
                                                         "besides the anomalies")
    spot_check_seed: int = Field(0, description="`reward spot-check`: seed of the uniform sample")
    judge_gold_path: Path | None = Field(None, description="`reward judge-check`: labelled answers (JSONL of "
                                                           "task_instruction, answer, correct, id)")
    judge_max_fpr: float = Field(0.05, ge=0, le=1, description="`reward judge-check`: highest false-positive "
                                                                "rate a judge may have")
    judge_max_fnr: float = Field(0.2, ge=0, le=1, description="`reward judge-check`: highest false-negative "
                                                               "rate a judge may have")
