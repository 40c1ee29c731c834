"""Metrics with confidence intervals, and reports (self-contained HTML, rich console).

Telemetry observes; it never changes behaviour (docs/architecture.md).
"""

from tryloop.telemetry.report import Report, render_tables
from tryloop.telemetry.stats import (
    Estimate,
    bootstrap_ci,
    mean_ci,
    pass_at_k,
    pass_at_k_ci,
    pass_at_k_mean,
    pass_counts,
    pass_rate,
    percentile,
    percentiles,
    wilson_interval,
)

__all__ = [
    "Estimate", "Report", "bootstrap_ci", "mean_ci", "pass_at_k", "pass_at_k_ci", "pass_at_k_mean",
    "pass_counts", "pass_rate", "percentile", "percentiles", "render_tables", "wilson_interval",
]
