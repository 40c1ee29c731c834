"""The curriculum sampler: keep the policy where it learns.

A group whose rewards are all equal carries no signal, so tasks the policy
always solves or never solves teach nothing. Each task's recent pass rate is
tracked over a window; a step draws mostly from tasks in the learning zone
(rate strictly between 0 and 1), then from tasks not yet seen, and a small
share from the rest so that a task can come back (a policy that improves can
start solving a task it never did). A task not yet sampled in this run takes
its measured pass rate (`prior`, e.g. the learning-zone measurement) as its
rate, so the first step already draws from the zone. The state (rates, RNG) is
checkpointed; the prior is measured data the run reads again.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Curriculum:
    fingerprints: list[str]
    window: int = 8
    explore: float = 0.25          # share of a step drawn outside the learning zone
    seed: int = 0
    prior: dict[str, float] = field(default_factory=dict)   # fingerprint -> measured pass rate
    history: dict[str, deque[int]] = field(default_factory=dict)
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        if not self.fingerprints:
            raise ValueError("the curriculum has no tasks")
        self.rng = random.Random(self.seed)

    def rate(self, fp: str) -> float | None:
        h = self.history.get(fp)
        return sum(h) / len(h) if h else self.prior.get(fp)

    def zone(self) -> tuple[list[str], list[str], list[str]]:
        """(learning zone, unseen, saturated: always 0 or always 1 so far)."""
        learning, unseen, saturated = [], [], []
        for fp in self.fingerprints:
            r = self.rate(fp)
            (unseen if r is None else learning if 0 < r < 1 else saturated).append(fp)
        return learning, unseen, saturated

    def sample(self, n: int) -> list[str]:
        learning, unseen, saturated = self.zone()
        n_explore = max(1, round(n * self.explore)) if (saturated or unseen) else 0
        picked = self.rng.sample(learning, min(len(learning), n - n_explore))
        pool = [fp for fp in unseen if fp not in picked]
        self.rng.shuffle(pool)
        rest = [fp for fp in saturated if fp not in picked]
        self.rng.shuffle(rest)
        for fp in pool + rest:
            if len(picked) >= n:
                break
            picked.append(fp)
        if len(picked) < n:  # fewer tasks than n: repeat at random
            picked += [self.rng.choice(self.fingerprints) for _ in range(n - len(picked))]
        return picked

    def record(self, fp: str, passed: bool) -> None:
        self.history.setdefault(fp, deque(maxlen=self.window)).append(int(passed))

    def state(self) -> dict[str, Any]:
        return {"history": {k: list(v) for k, v in self.history.items()}, "rng": self.rng.getstate()}

    def load(self, state: dict[str, Any]) -> None:
        self.history = {k: deque(v, maxlen=self.window) for k, v in state["history"].items()}
        rs = state["rng"]
        self.rng.setstate((rs[0], tuple(rs[1]), rs[2]))
