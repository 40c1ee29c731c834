"""The run's HTML report: did the policy learn?

Read top to bottom: a plain-words verdict and headline numbers; the train learning
curve with its intervals and a least-squares trend; held-out pass@1 at every
evaluation, per eval set; first vs last evaluation task by task with a paired sign
test; one task's episodes before and after; then where the time and memory went,
and the per-step table.

Inputs are the rows `tryloop train` writes (metrics.jsonl, evals.jsonl) and its
manifest. Every field beyond the oldest ones is optional: a run written before a
field existed still renders, with that part left out or shown as a dash.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tryloop.telemetry.report import Report
from tryloop.telemetry.stats import SignTest, paired_sign_test, slope_ci

DEFAULT_EVAL_SET = "held-out"
_ANSWER_CHARS = 4000          # per episode shown
_CHANGED_ROWS = 200           # tasks listed in the changed-tasks table

Row = dict[str, Any]


def build_report(metrics: list[Row], evals: list[Row], manifest: dict[str, Any],
                 trajectories_url: str | Path | None = None) -> Report:
    """The report of one run. `trajectories_url` (the TrajectoryStore's fsspec URL) adds
    one task's episodes from the first and the last evaluation; without it that part is
    left out."""
    r = Report(f"Training run {manifest.get('run_id', '')}",
               subtitle=f"code {str(manifest.get('code_revision', '?'))[:12]} · reward version "
                        f"{manifest.get('reward_spec_version', '?')} · {len(manifest.get('train_tasks', []))} train "
                        f"/ {len(manifest.get('eval_tasks', []))} held-out tasks")
    metrics = sorted(metrics, key=lambda m: m.get("step", 0))
    sets = _eval_sets(evals)
    trend = slope_ci([m["step"] for m in metrics if _num(m.get("reward_mean"))],
                     [m["reward_mean"] for m in metrics if _num(m.get("reward_mean"))])
    comparisons = {name: _compare(rows) for name, rows in sets.items()}

    r.add_text(_verdict(metrics, trend, sets, comparisons), title="Did it learn?")
    r.add_metrics(_headline(metrics, trend, sets, comparisons))
    if metrics:
        _learning_curve(r, metrics, trend)
    if sets:
        _held_out(r, sets, comparisons)
    if trajectories_url is not None and sets:
        _episodes(r, sets, manifest, trajectories_url)
    if metrics:
        _time_and_memory(r, metrics)
        _training_internals(r, metrics)
    return r


def write_report(run_dir: Path, metrics: list[Row], evals: list[Row], manifest: dict[str, Any],
                 trajectories_url: str | Path | None = None) -> Path:
    return build_report(metrics, evals, manifest, trajectories_url).write(Path(run_dir) / "report.html")


# ---- formatting --------------------------------------------------------------------

def _num(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _f(x: Any, spec: str = ".3f") -> str:
    return f"{x:{spec}}" if _num(x) else "-"


def _ci(value: Any, lo: Any, hi: Any, spec: str = ".3f") -> str:
    """`value [lo, hi]`, or just the value where the interval is missing."""
    if not _num(value):
        return "-"
    if _num(lo) and _num(hi):
        return f"{value:{spec}} [{lo:{spec}}, {hi:{spec}}]"
    return f"{value:{spec}}"


def _pct_ci(row: Row | None) -> str:
    if not row:
        return "-"
    return _ci(row.get("pass_at_1"), row.get("lo"), row.get("hi"), ".1%")


def _slope(e: Any, spec: str = "+.4f") -> str:
    return _ci(e.value, e.lo, e.hi, spec) if e.n else "-"


def _frac(v: Sequence[int] | None) -> str:
    if not v:
        return "-"
    p, a = v
    return f"{p}/{a}" + (f" ({p / a:.0%})" if a and a > 1 else "")


def _clip_text(s: str, n: int = _ANSWER_CHARS) -> str:
    """Head and tail of a long text, with the number of characters cut."""
    if len(s) <= n:
        return s
    head, tail = int(n * 0.6), int(n * 0.4)
    return f"{s[:head]}\n… [{len(s) - head - tail:,} characters cut] …\n{s[-tail:]}"


# ---- eval sets and first/last comparison ------------------------------------------

def _eval_sets(evals: list[Row]) -> dict[str, list[Row]]:
    """Eval rows per eval set name, by step ("held-out" first, rows without a name in it)."""
    out: dict[str, list[Row]] = {}
    for e in evals:
        out.setdefault(str(e.get("name") or DEFAULT_EVAL_SET), []).append(e)
    for rows in out.values():
        rows.sort(key=lambda e: e.get("step", 0))
    return dict(sorted(out.items(), key=lambda kv: (kv[0] != DEFAULT_EVAL_SET, kv[0])))


def _tasks(row: Row) -> dict[str, tuple[int, int]]:
    return {str(k): (int(v[0]), int(v[1])) for k, v in (row.get("tasks") or {}).items()}


class _Comparison:
    """First vs last evaluation of one eval set, task by task."""

    def __init__(self, first: Row, last: Row):
        self.first, self.last = first, last
        self.before, self.after = _tasks(first), _tasks(last)
        self.test: SignTest | None = None
        self.changed: list[tuple[str, tuple[int, int], tuple[int, int]]] = []
        if self.before and self.after and first is not last:
            self.test = paired_sign_test(self.before, self.after)
            for task in sorted(self.before.keys() & self.after.keys()):
                b, a = self.before[task], self.after[task]
                if b[1] and a[1] and b[0] / b[1] != a[0] / a[1]:
                    self.changed.append((task, b, a))
            # Gained first, biggest change first.
            self.changed.sort(key=lambda c: (-(c[2][0] / c[2][1] - c[1][0] / c[1][1]), c[0]))

    @property
    def delta(self) -> float | None:
        b, a = self.first.get("pass_at_1"), self.last.get("pass_at_1")
        return a - b if _num(a) and _num(b) and self.first is not self.last else None


def _compare(rows: list[Row]) -> _Comparison:
    return _Comparison(rows[0], rows[-1])


# ---- sections ----------------------------------------------------------------------

def _verdict(metrics: list[Row], trend: Any, sets: dict[str, list[Row]],
             comparisons: dict[str, _Comparison]) -> str:
    lines = []
    if trend.n >= 3 and _num(trend.lo):
        direction = ("rising (the interval is above 0)" if trend.lo > 0 else
                     "falling (the interval is below 0)" if trend.hi < 0 else
                     "no clear trend (the interval includes 0)")
        lines.append(f"Train reward: slope {trend.value:+.4g} per step, 95% CI [{trend.lo:+.4g}, {trend.hi:+.4g}] "
                     f"over {trend.n} steps: {direction}.")
    elif metrics:
        lines.append(f"Train reward: {len(metrics)} step(s), too few for a trend (it needs 3).")
    else:
        lines.append("No training steps recorded.")
    for name, c in comparisons.items():
        if c.first is c.last:
            lines.append(f"{name}: one evaluation (step {c.first.get('step')}), pass@1 {_pct_ci(c.first)}; "
                         "nothing to compare it with.")
            continue
        s = (f"{name}: pass@1 {_pct_ci(c.first)} at step {c.first.get('step')} → {_pct_ci(c.last)} at step "
             f"{c.last.get('step')}")
        if c.delta is not None:
            s += f" ({c.delta * 100:+.1f} points)"
        if c.test:
            t = c.test
            sig = "significant at 5%" if t.p_value < 0.05 else "not significant at 5%"
            s += (f"; {t.wins} task(s) gained, {t.losses} lost, {t.ties} unchanged; "
                  f"sign test p = {t.p_value:.3g} ({sig})")
        lines.append(s + ".")
    if not sets:
        lines.append("No held-out evaluations recorded.")
    return "\n\n".join(lines)


def _headline(metrics: list[Row], trend: Any, sets: dict[str, list[Row]],
              comparisons: dict[str, _Comparison]) -> dict[str, str]:
    out = {"steps": str(len(metrics)),
           "episodes": f"{sum(m.get('episodes') or 0 for m in metrics):,}",
           "reward slope / step [95% CI]": _slope(trend)}
    for name, c in comparisons.items():
        out[f"{name} pass@1 first"] = _pct_ci(c.first)
        out[f"{name} pass@1 last"] = _pct_ci(c.last) if c.last is not c.first else "-"
        if c.test:
            out[f"{name} gained / lost (sign p)"] = f"{c.test.wins} / {c.test.losses} (p={c.test.p_value:.3g})"
    rss = [m["peak_rss_mb"] for m in metrics if _num(m.get("peak_rss_mb"))]
    if rss:
        out["peak memory (RSS)"] = f"{max(rss):,.0f} MiB"
    wall = [m["time_step_s"] for m in metrics if _num(m.get("time_step_s"))]
    if wall:
        out["wall time (steps)"] = f"{sum(wall) / 60:,.1f} min"
    if metrics and _num(metrics[-1].get("pool_hit_rate")):
        out["pool hit rate"] = f"{metrics[-1]['pool_hit_rate']:.0%}"
    return out


def _band(metrics: list[Row], lo: str, hi: str) -> list[tuple[float, Any, Any]] | None:
    if not any(_num(m.get(lo)) and _num(m.get(hi)) for m in metrics):
        return None
    return [(m["step"], m.get(lo) if _num(m.get(lo)) else None, m.get(hi) if _num(m.get(hi)) else None)
            for m in metrics]


def _learning_curve(r: Report, metrics: list[Row], trend: Any) -> None:
    reward = {"mean reward": [(m["step"], m.get("reward_mean")) for m in metrics]}
    dashed = []
    if _num(trend.value):
        xs = [m["step"] for m in metrics if _num(m.get("reward_mean"))]
        ys = [m["reward_mean"] for m in metrics if _num(m.get("reward_mean"))]
        intercept = statistics.fmean(ys) - trend.value * statistics.fmean(xs)
        name = f"least-squares fit ({trend.value:+.3g}/step)"
        reward[name] = [(x, intercept + trend.value * x) for x in (min(xs), max(xs))]
        dashed.append(name)
    band = _band(metrics, "reward_lo", "reward_hi")
    r.add_line_chart("Train reward per step", reward, y_label="mean reward",
                     bands={"mean reward": band} if band else None, dashed=dashed,
                     caption=("Shaded: 95% CI of the step's mean reward. " if band else "")
                     + f"Slope of reward over steps: {_slope(trend)} (t-based 95% CI, n={trend.n}).")
    band = _band(metrics, "pass_lo", "pass_hi")
    r.add_line_chart("Train pass rate per step", {"pass rate": [(m["step"], m.get("pass_rate")) for m in metrics]},
                     y_range=(0, 1), y_label="pass rate", bands={"pass rate": band} if band else None,
                     caption="Shaded: Wilson 95% interval of the step's pass rate." if band else "")
    series: dict[str, list[tuple[float, Any]]] = {}
    if any("groups" in m for m in metrics):
        series["groups"] = [(m["step"], m.get("groups")) for m in metrics]
    for key, label in (("groups_mixed", "mixed groups (rewards differ)"), ("refills", "refills"),
                       ("groups_dropped", "groups dropped")):
        if any(_num(m.get(key)) for m in metrics):
            series[label] = [(m["step"], m.get(key)) for m in metrics]
    if series:
        r.add_line_chart("Groups per step: mixed, refilled, dropped", series, y_label="groups",
                         caption="A group whose episodes all got the same reward teaches nothing (zero advantage); "
                                 "refills are extra groups sampled to replace such groups.")


def _held_out(r: Report, sets: dict[str, list[Row]], comparisons: dict[str, _Comparison]) -> None:
    bands = {name: [(e["step"], e.get("lo"), e.get("hi")) for e in rows] for name, rows in sets.items()}
    r.add_line_chart("Held-out pass@1 at each evaluation (95% CI)",
                     {name: [(e["step"], e.get("pass_at_1")) for e in rows] for name, rows in sets.items()},
                     y_range=(0, 1), y_label="pass@1", bands=bands,
                     caption="One line per eval set; step -1 is before training. Shaded / bars: 95% interval.")
    r.add_table("Held-out evaluations", ["eval set", "step", "pass@1 [95% CI]", "mean reward", "episodes", "tasks"],
                [[name, e.get("step"), _pct_ci(e), _f(e.get("reward_mean")), e.get("episodes"),
                  len(e["tasks"]) if e.get("tasks") else None] for name, rows in sets.items() for e in rows])
    rows = []
    for name, c in comparisons.items():
        t = c.test
        rows.append([name, c.first.get("step"), _pct_ci(c.first),
                     c.last.get("step") if c.last is not c.first else None,
                     _pct_ci(c.last) if c.last is not c.first else "-",
                     f"{c.delta * 100:+.1f}" if c.delta is not None else "-",
                     t.wins if t else None, t.losses if t else None, t.ties if t else None,
                     f"{t.p_value:.3g}" if t else "-"])
    r.add_table("Before / after: first vs last evaluation",
                ["eval set", "first step", "pass@1 before", "last step", "pass@1 after", "Δ points",
                 "tasks gained", "tasks lost", "unchanged", "sign test p"], rows,
                caption="Gained / lost: tasks whose pass fraction rose / fell between the first and the last "
                        "evaluation. p: exact two-sided sign test over those tasks (ties left out).")
    changed = [[name, task, _frac(b), _frac(a), "gained" if a[0] / a[1] > b[0] / b[1] else "lost"]
               for name, c in comparisons.items() for task, b, a in c.changed]
    if any(c.test for c in comparisons.values()):
        r.add_table("Tasks that changed", ["eval set", "task", "before", "after", ""], changed[:_CHANGED_ROWS],
                    caption=f"{len(changed) - _CHANGED_ROWS} more not shown." if len(changed) > _CHANGED_ROWS else
                    "Passes / attempts in the first and the last evaluation.")


def _pick_task(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> tuple[str, str] | None:
    """A task failed first and passed last (else any task in both): (task id, why)."""
    both = sorted(before.keys() & after.keys())
    flipped = [t for t in both if before[t][1] > 0 and before[t][0] == 0 and after[t][0] > 0]
    if flipped:
        return flipped[0], "failed in the first evaluation, passed in the last"
    if both:
        return both[0], "no task went from failed to passed; showing the first task evaluated both times"
    return None


def _run_id(row: Row, name: str, manifest: dict[str, Any]) -> str | None:
    if row.get("run_id"):
        return str(row["run_id"])
    if name == DEFAULT_EVAL_SET and manifest.get("run_id"):   # runs written before eval rows named their run
        return f"{manifest['run_id']}-eval-{row.get('step')}"
    return None


def _answer(t: Any) -> str:
    """What the policy said, turn by turn (tool calls included)."""
    texts = [turn.text for turn in t.turns if turn.text] if t.turns else []
    if not texts:
        for m in t.messages:
            if m.get("role") != "assistant":
                continue
            text = m.get("content") or ""
            if not isinstance(text, str):
                text = str(text)
            for call in m.get("tool_calls") or []:
                fn = call.get("function", call) if isinstance(call, dict) else {}
                text += f"\n[tool call] {fn.get('name', '?')}({fn.get('arguments', '')})"
            texts.append(text.strip())
    if not texts:
        return "(no assistant text)"
    if len(texts) == 1:
        return _clip_text(texts[0])
    return _clip_text("\n\n".join(f"── turn {i + 1} ──\n{x}" for i, x in enumerate(texts)))


def _episodes(r: Report, sets: dict[str, list[Row]], manifest: dict[str, Any], url: str | Path) -> None:
    title = "One task before and after"
    name = DEFAULT_EVAL_SET if DEFAULT_EVAL_SET in sets else next(iter(sets))
    first, last = sets[name][0], sets[name][-1]
    if first is last:
        r.add_text(f"Only one {name} evaluation: nothing to compare.", title=title)
        return
    ids = _run_id(first, name, manifest), _run_id(last, name, manifest)
    if None in ids:
        r.add_text(f"The {name} evaluation rows name no trajectory run id.", title=title)
        return
    try:
        from tryloop.store.trajectories import TrajectoryStore
        from tryloop.telemetry.stats import pass_counts

        store = TrajectoryStore(url)
        before, after = _tasks(first), _tasks(last)
        pre: list[Any] | None = None
        post: list[Any] | None = None
        if not (before and after):   # older rows: count from the episodes themselves
            pre, post = store.read(run_id=ids[0]), store.read(run_id=ids[1])
            before = {k: (c, n) for k, (n, c) in pass_counts(pre).items()}
            after = {k: (c, n) for k, (n, c) in pass_counts(post).items()}
        pick = _pick_task(before, after)
        if pick is None:
            r.add_text(f"No task appears in both the first ({ids[0]}) and the last ({ids[1]}) {name} evaluation.",
                       title=title)
            return
        task, why = pick
        pre = [t for t in pre if t.task_id == task] if pre is not None else store.read(run_id=ids[0], task_id=task)
        post = [t for t in post if t.task_id == task] if post is not None else store.read(run_id=ids[1],
                                                                                          task_id=task)
    except Exception as e:   # a report must render even when the store is gone or unreadable
        r.add_text(f"Could not read the episodes from {url}: {type(e).__name__}: {e}", title=title)
        return
    if not pre or not post:
        r.add_text(f"Task {task}: no episodes found in the store for run "
                   f"{ids[0] if not pre else ids[1]}.", title=title)
        return
    b, a = _representative(pre, "fail"), _representative(post, "pass")

    def col(ts: list[Any], t: Any, row: Row, run: str) -> list[Any]:
        n_pass = sum(x.verdict == "pass" for x in ts)
        return [f"step {row.get('step')} · run {run}", f"{t.verdict or '-'} · reward {_f(t.reward)}",
                f"{n_pass}/{len(ts)} passed; shown: sample {t.sample_index}",
                f"{t.termination} · {_turns(t)} turn(s)" + (f" · {t.verdict_reason}" if t.verdict_reason else ""),
                _answer(t)]

    left, right = col(pre, b, first, ids[0]), col(post, a, last, ids[1])
    labels = ["evaluation", "verdict", "episodes of this task", "ended", "assistant's answer"]
    r.add_table(f"{title}: {task}", ["", "before", "after"],
                [[k, x, y] for k, x, y in zip(labels, left, right, strict=True)],
                caption=f"{name} task {task}: {why}. Long answers are clipped in the middle.")


def _turns(t: Any) -> int:
    return len(t.turns) or sum(m.get("role") == "assistant" for m in t.messages)


def _representative(ts: list[Any], prefer: str) -> Any:
    ts = sorted(ts, key=lambda t: (t.sample_index, t.episode_id))
    return next((t for t in ts if t.verdict == prefer), ts[0])


_PHASES = (("generation", "time_generation_s"), ("verification", "time_verification_s"),
           ("environment", "time_environment_s"), ("update", "time_update_s"))


def _time_and_memory(r: Report, metrics: list[Row]) -> None:
    if any(_num(m.get("time_rollout_wall_s")) for m in metrics):
        # Wall-clock phases: episodes overlap, so their summed parts do not add up to the step.
        phases = (("rollout (wall)", "time_rollout_wall_s"), ("update", "time_update_s"))
        series = {label: [(m["step"], m.get(k) if _num(m.get(k)) else None) for m in metrics] for label, k in phases}
        series["other"] = [(m["step"], max(0.0, m["time_step_s"] - m["time_rollout_wall_s"] - m["time_update_s"])
                            if all(_num(m.get(k)) for k in ("time_step_s", "time_rollout_wall_s", "time_update_s"))
                            else None) for m in metrics]
        series["step (wall)"] = [(m["step"], m.get("time_step_s") if _num(m.get("time_step_s")) else None)
                                 for m in metrics]
        r.add_line_chart("Time per step (wall clock)", series, y_label="seconds",
                         caption="rollout = generation, tools and verification of the step's episodes, overlapped")
        summed = {label: round(sum(m.get(k) or 0.0 for m in metrics), 1) for label, k in _PHASES[:3]}
        r.add_bars("Episode time by part (seconds, summed over episodes)", summed, unit="s")
        _memory(r, metrics)
        return
    series = {label: [(m["step"], m.get(k) if _num(m.get(k)) else None) for m in metrics]
              for label, k in _PHASES if any(_num(m.get(k)) for m in metrics)}
    caption = ""
    if any(_num(m.get("time_step_s")) for m in metrics):
        other, negative = [], 0
        for m in metrics:
            wall = m.get("time_step_s")
            parts = [m.get(k) for _, k in _PHASES if _num(m.get(k))]
            rest = wall - sum(parts) if _num(wall) else None
            if rest is not None and rest < 0:
                negative += 1
                rest = None
            other.append((m["step"], rest))
        series["other"] = other
        series["step (wall)"] = [(m["step"], m.get("time_step_s") if _num(m.get("time_step_s")) else None)
                                 for m in metrics]
        caption = "other = the step's wall time minus the listed parts."
        if negative:
            caption += (f" In {negative} step(s) the parts add up to more than the wall time (they are summed "
                        "over episodes that run at the same time), so 'other' is left out there.")
    if series:
        r.add_line_chart("Time per step", series, y_label="seconds", caption=caption)
        split = {label: sum(p[1] for p in pts if p[1] is not None) for label, pts in series.items()
                 if label != "step (wall)"}
        r.add_bars("Time split (seconds, summed over steps)", {k: round(v, 1) for k, v in split.items()}, unit="s")
    _memory(r, metrics)


def _memory(r: Report, metrics: list[Row]) -> None:
    rss = [(m["step"], m.get("peak_rss_mb") if _num(m.get("peak_rss_mb")) else None) for m in metrics]
    if any(v is not None for _, v in rss):
        r.add_line_chart("Peak memory (RSS) per step", {"peak RSS": rss}, y_label="MiB",
                         caption=f"Highest: {max(v for _, v in rss if v is not None):,.0f} MiB.")
    p50 = [m["verify_p50_s"] for m in metrics if _num(m.get("verify_p50_s"))]
    p99 = [m["verify_p99_s"] for m in metrics if _num(m.get("verify_p99_s"))]
    if p50 or p99:
        r.add_table("Reward latency (verifier)", ["", "value"],
                    [["p50 (median of steps)", f"{statistics.median(p50):.2f}s" if p50 else "-"],
                     ["p99 (max of steps)", f"{max(p99):.2f}s" if p99 else "-"]])


def _training_internals(r: Report, metrics: list[Row]) -> None:
    learn = {label: [(m["step"], m.get(k)) for m in metrics]
             for label, k in (("loss", "learn_loss"), ("grad norm", "learn_grad_norm"))
             if any(_num(m.get(k)) for m in metrics)}
    if learn:
        r.add_line_chart("Loss and gradient norm", learn)
    flags: dict[str, int] = {}
    for m in metrics:
        for k, v in (m.get("flags") or {}).items():
            flags[k] = flags.get(k, 0) + v
    if flags:
        r.add_bars("Detector flags by kind", flags)

    def kept(m: Row) -> str:
        g = m.get("groups")
        return f"{g - (m.get('groups_dropped') or 0)}/{g}" if _num(g) else "-"

    r.add_table("Steps", ["step", "episodes", "reward [95% CI]", "pass rate [95% CI]", "groups kept", "mixed",
                          "refills", "masked", "loss", "step s", "update s", "peak RSS MiB"],
                [[m.get("step"), m.get("episodes"), _ci(m.get("reward_mean"), m.get("reward_lo"), m.get("reward_hi")),
                  _ci(m.get("pass_rate"), m.get("pass_lo"), m.get("pass_hi")), kept(m), m.get("groups_mixed"),
                  m.get("refills"), m.get("masked"), _f(m.get("learn_loss")), _f(m.get("time_step_s"), ".1f"),
                  _f(m.get("time_update_s"), ".1f"), _f(m.get("peak_rss_mb"), ",.0f")] for m in metrics])
