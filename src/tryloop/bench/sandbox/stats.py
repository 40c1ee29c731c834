"""Samples and rows: percentiles, series of timings, targets and their verdicts."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any


def percentile(samples: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of the samples."""
    s = sorted(samples)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


def summarize(samples: list[float]) -> dict[str, float | int]:
    """n, p50, p99, mean, min, max, all in milliseconds."""
    if not samples:
        return {"n": 0}
    def ms(seconds: float) -> float:
        return round(seconds * 1e3, 4)

    return {
        "n": len(samples),
        "p50_ms": ms(statistics.median(samples)),
        "p99_ms": ms(percentile(samples, 99)),
        "mean_ms": ms(statistics.fmean(samples)),
        "min_ms": ms(min(samples)),
        "max_ms": ms(max(samples)),
    }


@dataclass
class Series:
    label: str  # short, for the table
    desc: str = ""  # what exactly is timed, for the JSON
    samples: list[float] = field(default_factory=list)
    unavailable: str = ""  # why there are no samples (e.g. bwrap not installed)

    @property
    def p50(self) -> float | None:
        return statistics.median(self.samples) if self.samples else None


@dataclass(frozen=True)
class Target:
    text: str
    p50_max_s: float | None = None  # ours p50 at most this
    ratio_max: float | None = None  # ours p50 at most this times baselines[0] p50

    def verdict(self, ours: Series, baselines: list[Series]) -> str | None:
        if ours.p50 is None:
            return None
        if self.p50_max_s is not None:
            return "meets" if ours.p50 <= self.p50_max_s else "misses"
        if self.ratio_max is not None and baselines and baselines[0].p50:
            return "meets" if ours.p50 <= self.ratio_max * baselines[0].p50 else "misses"
        return None


@dataclass
class Row:
    key: str
    title: str
    ours: Series
    baselines: list[Series]
    target: Target | None = None
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        base = []
        for b in self.baselines:
            d: dict[str, Any] = {"label": b.label, "desc": b.desc, **summarize(b.samples)}
            if b.unavailable:
                d["unavailable"] = b.unavailable
            if b.p50 and self.ours.p50 is not None:
                d["ratio"] = round(self.ours.p50 / b.p50, 4)
            base.append(d)
        return {
            "title": self.title,
            "ours": {"label": self.ours.label, "desc": self.ours.desc, **summarize(self.ours.samples)},
            "baselines": base,
            "target": self.target.text if self.target else None,
            "verdict": self.target.verdict(self.ours, self.baselines) if self.target else None,
            "notes": self.notes,
            **({"extra": self.extra} if self.extra else {}),
        }
