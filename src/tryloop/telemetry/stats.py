"""Estimators with honest uncertainty: pass@k, proportions, means, percentiles.

Pure functions of numbers, standard library only. Undefined values (the mean
of nothing, an interval from one sample) are NaN rather than an exception, so
a report over a sparse run still renders; invalid arguments raise.

- pass@k: the unbiased estimator of Chen et al. 2021 (Evaluating Large Language
  Models Trained on Code): per task, with n samples of which c pass,
  1 - C(n-c, k) / C(n, k); averaged over tasks. Its interval is a percentile
  bootstrap over tasks (tasks are the unit that varies between evaluations;
  samples within a task are not independent draws of the benchmark). When every
  task scores the same (nothing passes, or everything does) the bootstrap cannot
  vary and would give [0, 0]; the Wilson interval over the tasks is used instead.
- a pass rate (pass@1 as a proportion of attempts): Wilson score interval, which
  stays inside [0, 1] and behaves at 0 and n successes, unlike the normal one.
- a mean: Student-t interval (small n matters: eval seeds are few).
- percentiles: linear interpolation between order statistics (NumPy's default).
- a trend: least-squares slope with a Student-t interval (n - 2 degrees of freedom).
- before/after over tasks: exact two-sided sign test on the per-task changes.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist, fmean, stdev
from typing import Protocol

NAN = float("nan")


@dataclass(frozen=True)
class Estimate:
    value: float
    lo: float
    hi: float
    n: int                     # tasks, attempts or samples the estimate rests on
    confidence: float = 0.95

    def __str__(self) -> str:
        return f"{self.value:.4g} [{self.lo:.4g}, {self.hi:.4g}] (n={self.n})"


def _check_confidence(confidence: float) -> None:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), not {confidence}")


# ---- pass@k -------------------------------------------------------------------------

def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples drawn without replacement from n
    (c of them correct) is correct: 1 - C(n-c, k) / C(n, k). Exact integer binomials,
    one correctly rounded division."""
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n} c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got n={n} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def _per_task(counts: Iterable[tuple[int, int]] | Mapping[str, tuple[int, int]], k: int) -> list[float]:
    items = counts.items() if isinstance(counts, Mapping) else enumerate(counts)
    out = []
    for task, (n, c) in items:
        try:
            out.append(pass_at_k(n, c, k))
        except ValueError as e:
            raise ValueError(f"task {task}: {e}") from None
    return out


def pass_at_k_mean(counts: Iterable[tuple[int, int]] | Mapping[str, tuple[int, int]], k: int) -> float:
    """pass@k averaged over tasks; `counts` is (n, c) per task. NaN with no tasks."""
    values = _per_task(counts, k)
    return fmean(values) if values else NAN


def pass_at_k_ci(counts: Iterable[tuple[int, int]] | Mapping[str, tuple[int, int]], k: int, *,
                 confidence: float = 0.95, n_boot: int = 1000, seed: int = 0) -> Estimate:
    """pass@k over tasks with a percentile-bootstrap interval over tasks (fixed seed:
    the same counts always give the same interval)."""
    values = _per_task(counts, k)
    if not values:
        return Estimate(NAN, NAN, NAN, 0, confidence)
    lo, hi = bootstrap_ci(values, confidence=confidence, n_boot=n_boot, seed=seed)
    if lo == hi:
        # Every task scored the same (nothing passes, or everything does): resampling tasks
        # cannot vary, and [0, 0] would claim certainty that m tasks do not give. The Wilson
        # interval for the same proportion over m tasks does not collapse.
        lo, hi = _wilson(fmean(values), len(values), _z(confidence))
    return Estimate(fmean(values), lo, hi, len(values), confidence)


class Judged(Protocol):
    @property
    def task_id(self) -> str: ...
    @property
    def verdict(self) -> str | None: ...


def pass_counts(episodes: Iterable[Judged]) -> dict[str, tuple[int, int]]:
    """(n, c) per task from judged episodes. no_verdict (and unjudged) episodes are
    left out: they are not evidence either way (docs/architecture.md, invariant 4)."""
    out: dict[str, tuple[int, int]] = {}
    for e in episodes:
        if e.verdict not in ("pass", "fail"):
            continue
        n, c = out.get(e.task_id, (0, 0))
        out[e.task_id] = (n + 1, c + (e.verdict == "pass"))
    return out


# ---- bootstrap ----------------------------------------------------------------------

def bootstrap_ci(values: Sequence[float], statistic: Callable[[Sequence[float]], float] = fmean, *,
                 confidence: float = 0.95, n_boot: int = 1000, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of `statistic` over `values` (resampled with
    replacement, `n_boot` times, from `random.Random(seed)`)."""
    _check_confidence(confidence)
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, not {n_boot}")
    if not values:
        return NAN, NAN
    rng = random.Random(seed)
    m = len(values)
    stats = sorted(statistic(rng.choices(values, k=m)) for _ in range(n_boot))
    alpha = 1 - confidence
    return percentile(stats, 100 * alpha / 2), percentile(stats, 100 * (1 - alpha / 2))


# ---- proportions ---------------------------------------------------------------------

def _z(confidence: float) -> float:
    _check_confidence(confidence)
    return NormalDist().inv_cdf(1 - (1 - confidence) / 2)


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion; (NaN, NaN) with n == 0."""
    if not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n, got {successes}/{n}")
    z = _z(confidence)
    if n == 0:
        return NAN, NAN
    return _wilson(successes / n, n, z)


def _wilson(p: float, n: int, z: float) -> tuple[float, float]:
    denom = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # At 0 or n successes the bound is exactly 0 or 1; rounding would leave an ulp.
    return (0.0 if p == 0 else center - half), (1.0 if p == 1 else center + half)


def pass_rate(successes: int, n: int, confidence: float = 0.95) -> Estimate:
    """A pass rate (e.g. pass@1 over attempts) with its Wilson interval."""
    lo, hi = wilson_interval(successes, n, confidence)
    return Estimate(successes / n if n else NAN, lo, hi, n, confidence)


# ---- means -------------------------------------------------------------------------

def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1, a - 1
    c, d = 1.0, 1 - qab * x / qap
    d = 1 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)),
                   -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1 + aa * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1) < eps:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * _betacf(a, b, x) / a
    return 1 - front * _betacf(b, a, 1 - x) / b


def t_cdf(t: float, df: float) -> float:
    """Student-t cumulative distribution function."""
    tail = 0.5 * _betainc(df / 2, 0.5, df / (df + t * t))
    return 1 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """Student-t quantile, by bisection on t_cdf (to ~1e-12)."""
    if not 0 < p < 1:
        raise ValueError(f"p must be in (0, 1), not {p}")
    if df <= 0:
        raise ValueError(f"df must be > 0, not {df}")
    if p < 0.5:
        return -t_quantile(1 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2


def mean_ci(values: Sequence[float], confidence: float = 0.95) -> Estimate:
    """Mean with a Student-t interval. NaN bounds with fewer than 2 values."""
    _check_confidence(confidence)
    n = len(values)
    if n == 0:
        return Estimate(NAN, NAN, NAN, 0, confidence)
    mean = fmean(values)
    if n == 1:
        return Estimate(mean, NAN, NAN, 1, confidence)
    half = t_quantile(1 - (1 - confidence) / 2, n - 1) * stdev(values) / math.sqrt(n)
    return Estimate(mean, mean - half, mean + half, n, confidence)


# ---- percentiles -------------------------------------------------------------------

def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear between order statistics: for sorted x,
    position h = (n-1) q/100, value x[floor h] + (h - floor h)(x[floor h + 1] - x[floor h])."""
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in [0, 100], not {q}")
    if not values:
        return NAN
    xs = sorted(values)
    h = (len(xs) - 1) * q / 100
    i = math.floor(h)
    if i + 1 >= len(xs):
        return float(xs[-1])
    return xs[i] + (h - i) * (xs[i + 1] - xs[i])


def nearest_rank(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) as one of the values: for sorted x, x[round((n-1) q/100)]
    (what a few samples, such as a run's step intervals, are reported with); NaN for none."""
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in [0, 100], not {q}")
    xs = sorted(values)
    return float(xs[min(len(xs) - 1, round(q / 100 * (len(xs) - 1)))]) if xs else NAN


def percentiles(values: Sequence[float], qs: Iterable[float] = (50, 90, 99)) -> dict[float, float]:
    xs = sorted(values)
    return {q: percentile(xs, q) for q in qs}


# ---- trends and paired comparisons --------------------------------------------------

def slope_ci(xs: Sequence[float], ys: Sequence[float], confidence: float = 0.95) -> Estimate:
    """Ordinary least-squares slope of ys on xs with a Student-t interval:
    b = Sxy / Sxx, se(b) = sqrt(SSE / (n - 2) / Sxx), b +- t(1 - a/2, n - 2) se(b).
    Pairs with a None or non-finite member are left out. NaN slope with fewer than
    2 points or all xs equal; NaN bounds with fewer than 3 points."""
    _check_confidence(confidence)
    if len(xs) != len(ys):
        raise ValueError(f"xs and ys differ in length: {len(xs)} != {len(ys)}")
    pts = [(float(x), float(y)) for x, y in zip(xs, ys, strict=True)
           if x is not None and y is not None and math.isfinite(x) and math.isfinite(y)]
    n = len(pts)
    if n < 2:
        return Estimate(NAN, NAN, NAN, n, confidence)
    mx, my = fmean(p[0] for p in pts), fmean(p[1] for p in pts)
    sxx = math.fsum((x - mx) ** 2 for x, _ in pts)
    if sxx == 0:
        return Estimate(NAN, NAN, NAN, n, confidence)
    b = math.fsum((x - mx) * (y - my) for x, y in pts) / sxx
    if n < 3:
        return Estimate(b, NAN, NAN, n, confidence)
    a = my - b * mx
    sse = math.fsum((y - a - b * x) ** 2 for x, y in pts)
    half = t_quantile(1 - (1 - confidence) / 2, n - 2) * math.sqrt(sse / (n - 2) / sxx)
    return Estimate(b, b - half, b + half, n, confidence)


@dataclass(frozen=True)
class SignTest:
    wins: int          # tasks whose value rose from before to after
    losses: int        # tasks whose value fell
    ties: int          # tasks whose value did not change
    p_value: float     # exact two-sided; 1.0 when nothing changed


def _task_value(v: float | Sequence[int]) -> float:
    """A per-task value: a number, or (passes, attempts) as the pass fraction."""
    if isinstance(v, int | float):
        return float(v)
    passes, attempts = v
    if attempts <= 0:
        return NAN
    return passes / attempts


def sign_test_p(wins: int, losses: int) -> float:
    """Exact two-sided sign test: 2 P(X <= min(wins, losses)), X ~ Binomial(wins + losses, 1/2),
    capped at 1 (ties are left out before calling)."""
    if wins < 0 or losses < 0:
        raise ValueError(f"need wins, losses >= 0, got {wins}, {losses}")
    n = wins + losses
    if n == 0:
        return 1.0
    k = min(wins, losses)
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n)


def paired_sign_test(before: Mapping[str, float | Sequence[int]],
                     after: Mapping[str, float | Sequence[int]]) -> SignTest:
    """Paired sign test over the tasks in both mappings. A value is a number (e.g. a
    pass fraction) or a (passes, attempts) pair, compared as a fraction: a task is a
    win if it rose, a loss if it fell, a tie if equal. Tasks in only one mapping, or
    without attempts, are left out."""
    wins = losses = ties = 0
    for task in sorted(before.keys() & after.keys()):
        b, a = _task_value(before[task]), _task_value(after[task])
        if math.isnan(b) or math.isnan(a):
            continue
        if a > b:
            wins += 1
        elif a < b:
            losses += 1
        else:
            ties += 1
    return SignTest(wins, losses, ties, sign_test_p(wins, losses))
