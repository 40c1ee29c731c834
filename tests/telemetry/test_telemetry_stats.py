"""Estimators against values computed by hand (and published tables)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from tryloop.telemetry.stats import (
    bootstrap_ci,
    mean_ci,
    pass_at_k,
    pass_at_k_ci,
    pass_at_k_mean,
    pass_counts,
    pass_rate,
    percentile,
    percentiles,
    t_quantile,
    wilson_interval,
)


@pytest.mark.parametrize(("n", "c", "k", "expected"), [
    (5, 2, 1, 2 / 5),                 # pass@1 is the pass fraction
    (5, 2, 2, 1 - 3 / 10),            # 1 - C(3,2)/C(5,2)
    (5, 2, 3, 1 - 1 / 10),            # 1 - C(3,3)/C(5,3)
    (5, 2, 4, 1.0),                   # n - c < k: some draw must pass
    (10, 3, 5, 1 - 21 / 252),         # 1 - C(7,5)/C(10,5)
    (10, 0, 10, 0.0),
    (10, 10, 1, 1.0),
    (200, 1, 100, 0.5),               # 1 - C(199,100)/C(200,100) = 1 - 100/200
])
def test_pass_at_k_by_hand(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-15)


def test_pass_at_k_is_exact_for_large_n():
    # The naive float product form loses digits here; exact binomials do not.
    assert pass_at_k(1000, 1, 1) == pytest.approx(0.001, rel=1e-15)
    assert pass_at_k(1000, 999, 1) == pytest.approx(0.999, rel=1e-15)


@pytest.mark.parametrize(("n", "c", "k"), [(5, 6, 1), (5, -1, 1), (5, 2, 0), (5, 2, 6)])
def test_pass_at_k_rejects_impossible_counts(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_pass_at_k_averages_over_tasks():
    counts = {"a": (5, 2), "b": (5, 0), "c": (4, 4)}
    assert pass_at_k_mean(counts, 1) == pytest.approx((0.4 + 0.0 + 1.0) / 3)
    assert pass_at_k_mean(counts, 2) == pytest.approx((0.7 + 0.0 + 1.0) / 3)
    assert math.isnan(pass_at_k_mean({}, 1))


def test_bootstrap_interval_over_tasks():
    est = pass_at_k_ci({"a": (5, 2), "b": (5, 0), "c": (4, 4), "d": (4, 1)}, 1)
    assert est.value == pytest.approx((0.4 + 0 + 1 + 0.25) / 4) and est.n == 4
    assert est.lo <= est.value <= est.hi
    assert est == pass_at_k_ci({"a": (5, 2), "b": (5, 0), "c": (4, 4), "d": (4, 1)}, 1)   # fixed seed
    # Two tasks at 0 and 1: a resampled mean is 0, 1/2 or 1 with probabilities 1/4, 1/2, 1/4,
    # so the central 95% spans [0, 1]. Identical tasks leave nothing to vary.
    assert bootstrap_ci([0.0, 1.0], n_boot=4000) == (0.0, 1.0)
    assert bootstrap_ci([0.3] * 10) == (pytest.approx(0.3), pytest.approx(0.3))
    narrow = bootstrap_ci([0.0, 1.0] * 500, confidence=0.95)
    assert 0.45 < narrow[0] < 0.5 < narrow[1] < 0.55


def test_pass_at_k_interval_does_not_collapse_when_every_task_scores_the_same():
    # Ten tasks, nothing passes: the bootstrap can only resample zeros; the interval is the
    # Wilson one over ten tasks, [0, z^2/10 / (1 + z^2/10)] = [0, 0.2775].
    none = pass_at_k_ci({f"t{i}": (4, 0) for i in range(10)}, 1)
    assert none.value == 0.0 and none.lo == 0.0 and none.hi == pytest.approx(0.277533, abs=1e-6)
    every = pass_at_k_ci({f"t{i}": (4, 4) for i in range(10)}, 1)
    assert every.hi == 1.0 and every.lo == pytest.approx(1 - 0.277533, abs=1e-6)
    assert (none.lo, none.hi) == wilson_interval(0, 10)


def test_wilson_interval_by_hand():
    # p = 1/2, n = 10, z = 1.959964: centre 1/2, half-width z*sqrt(.025 + z^2/400)/(1 + z^2/10).
    lo, hi = wilson_interval(5, 10)
    assert (lo, hi) == (pytest.approx(0.236593, abs=1e-6), pytest.approx(0.763407, abs=1e-6))
    # At 0 successes: [0, (z^2/n)/(1 + z^2/n)].
    z2 = 1.959963984540054 ** 2
    assert wilson_interval(0, 10) == (0.0, pytest.approx((z2 / 10) / (1 + z2 / 10)))
    assert wilson_interval(10, 10) == (pytest.approx(1 - (z2 / 10) / (1 + z2 / 10)), 1.0)
    est = pass_rate(3, 4, confidence=0.9)
    assert est.value == 0.75 and est.lo < 0.75 < est.hi < 1 and est.n == 4
    assert all(math.isnan(x) for x in wilson_interval(0, 0))
    with pytest.raises(ValueError):
        wilson_interval(5, 4)


def test_student_t_quantiles_match_tables():
    for df, t in [(1, 12.7062047), (4, 2.7764451), (9, 2.2621572), (30, 2.0422725)]:
        assert t_quantile(0.975, df) == pytest.approx(t, abs=1e-6)
    assert t_quantile(0.995, 10) == pytest.approx(3.1692727, abs=1e-6)
    assert t_quantile(0.025, 4) == pytest.approx(-2.7764451, abs=1e-6)


def test_mean_ci_by_hand():
    # mean 3, s = sqrt(2.5), se = s/sqrt(5); t(0.975, 4) = 2.7764451.
    est = mean_ci([1, 2, 3, 4, 5])
    half = 2.7764451 * math.sqrt(2.5) / math.sqrt(5)
    assert est.value == 3 and est.lo == pytest.approx(3 - half, abs=1e-6) and est.hi == pytest.approx(3 + half, abs=1e-6)
    one = mean_ci([7.0])
    assert one.value == 7.0 and math.isnan(one.lo) and math.isnan(one.hi)
    assert math.isnan(mean_ci([]).value)


def test_percentiles_interpolate_linearly():
    xs = [10, 1, 4, 3, 2]                       # sorted: 1 2 3 4 10
    assert percentiles(xs) == {50: 3, 90: pytest.approx(7.6), 99: pytest.approx(9.76)}
    assert percentile(xs, 0) == 1 and percentile(xs, 100) == 10 and percentile(xs, 25) == 2
    assert percentile([5], 90) == 5 and math.isnan(percentile([], 50))
    with pytest.raises(ValueError):
        percentile(xs, 101)


@dataclass
class Episode:
    task_id: str
    verdict: str | None


def test_pass_counts_leave_out_episodes_without_verdict():
    episodes = [Episode("a", "pass"), Episode("a", "fail"), Episode("a", "no_verdict"), Episode("b", "fail"),
                Episode("c", None), Episode("a", "pass")]
    assert pass_counts(episodes) == {"a": (3, 2), "b": (1, 0)}


def test_a_task_with_fewer_samples_than_k_is_named():
    with pytest.raises(ValueError, match="task b: need 1 <= k <= n"):
        pass_at_k_mean({"a": (8, 1), "b": (3, 1)}, 4)
