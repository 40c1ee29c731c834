"""The run's HTML report: curves on train and held-out tasks, the time split, pool and verifier figures."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from tryloop.telemetry.report import Report


def build_report(metrics: list[dict[str, Any]], evals: list[dict[str, Any]], manifest: dict[str, Any]) -> Report:
    r = Report(f"Training run {manifest.get('run_id', '')}",
               subtitle=f"code {manifest.get('code_revision', '?')[:12]} · reward version "
                        f"{manifest.get('reward_spec_version', '?')} · {len(manifest.get('train_tasks', []))} train "
                        f"/ {len(manifest.get('eval_tasks', []))} held-out tasks")
    last_eval = evals[-1] if evals else {}
    first_eval = evals[0] if evals else {}
    fmt = lambda e: "-" if not e or e.get("pass_at_1") is None else \
        f"{e['pass_at_1']:.1%} [{e['lo']:.1%}, {e['hi']:.1%}]"  # noqa: E731
    r.add_metrics({"steps": str(len(metrics)), "held-out pass@1 first": fmt(first_eval),
                   "held-out pass@1 last": fmt(last_eval),
                   "episodes": str(sum(m["episodes"] for m in metrics)),
                   "pool hit rate": f"{metrics[-1]['pool_hit_rate']:.0%}" if metrics else "-"})
    if metrics:
        r.add_line_chart("Reward and pass rate on train tasks", {
            "mean reward": [(m["step"], m["reward_mean"]) for m in metrics],
            "pass rate": [(m["step"], m["pass_rate"]) for m in metrics]}, y_label="")
    if evals:
        r.add_line_chart("Held-out pass@1 (95% CI)", {
            "pass@1": [(e["step"], e["pass_at_1"]) for e in evals],
            "lower": [(e["step"], e["lo"]) for e in evals],
            "upper": [(e["step"], e["hi"]) for e in evals]}, y_range=(0, 1))
    if metrics:
        r.add_line_chart("Loss and gradient norm", {
            "loss": [(m["step"], m.get("learn_loss")) for m in metrics],
            "grad norm": [(m["step"], m.get("learn_grad_norm")) for m in metrics]})
        split = {k: sum(m[f"time_{k}_s"] for m in metrics) for k in ("generation", "environment",
                                                                     "verification", "update")}
        r.add_bars("Time split (seconds, summed)", {k: round(v, 1) for k, v in split.items()}, unit="s")
        r.add_table("Reward latency (verifier)", ["", "value"],
                    [["p50 (median of steps)", f"{statistics.median(m['verify_p50_s'] for m in metrics):.2f}s"],
                     ["p99 (max of steps)", f"{max(m['verify_p99_s'] for m in metrics):.2f}s"]])
        flags: dict[str, int] = {}
        for m in metrics:
            for k, v in m.get("flags", {}).items():
                flags[k] = flags.get(k, 0) + v
        if flags:
            r.add_bars("Detector flags by kind", flags)
        r.add_table("Steps", ["step", "episodes", "reward", "pass rate", "groups kept", "masked", "loss", "update s"],
                    [[m["step"], m["episodes"], _f(m["reward_mean"]), _f(m["pass_rate"]),
                      f"{m['groups'] - m['groups_dropped']}/{m['groups']}", m["masked"], _f(m.get("learn_loss")),
                      f"{m['time_update_s']:.1f}"] for m in metrics])
    return r


def _f(x: Any) -> str:
    return "-" if x is None else f"{x:.3f}"


def write_report(run_dir: Path, metrics: list[dict[str, Any]], evals: list[dict[str, Any]],
                 manifest: dict[str, Any]) -> Path:
    return build_report(metrics, evals, manifest).write(run_dir / "report.html")
