"""The training report: built from synthetic rows (old and new fields), with its
sections, numbers and one task's episodes; the two statistics it rests on."""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET

import pytest

from tryloop.agent.trajectory import Trajectory, Turn
from tryloop.store.trajectories import TrajectoryStore
from tryloop.telemetry.report import Report
from tryloop.telemetry.stats import paired_sign_test, sign_test_p, slope_ci, wilson_interval
from tryloop.train.report import build_report, write_report

SVG = "{http://www.w3.org/2000/svg}"
EVIL = "<script>alert('pwned')</script>"
MANIFEST = {"run_id": "r1", "code_revision": "abcdef1234567890", "reward_spec_version": "v3",
            "train_tasks": ["a"] * 20, "eval_tasks": ["b"] * 8}


# ---- statistics -----------------------------------------------------------------------

def test_sign_test_by_hand():
    t = paired_sign_test({f"t{i}": 0.0 for i in range(8)}, {f"t{i}": 1.0 for i in range(8)})
    assert (t.wins, t.losses, t.ties) == (8, 0, 0)
    assert t.p_value == 0.0078125                      # 2 / 2^8
    assert sign_test_p(0, 8) == 0.0078125
    assert sign_test_p(1, 7) == pytest.approx(2 * 9 / 256)   # 2 (C(8,0) + C(8,1)) / 2^8
    assert sign_test_p(3, 3) == 1.0                    # capped
    assert sign_test_p(0, 0) == 1.0                    # nothing changed: no evidence


def test_sign_test_pairs_tasks_and_uses_fractions():
    before = {"a": [0, 4], "b": [2, 4], "c": [1, 2], "only-before": [0, 1], "none": [0, 0]}
    after = {"a": [1, 4], "b": (1, 4), "c": [2, 4], "only-after": [1, 1], "none": [1, 1]}
    t = paired_sign_test(before, after)
    # a rose, b fell, c the same fraction (1/2 = 2/4); unpaired tasks and 0 attempts left out.
    assert (t.wins, t.losses, t.ties) == (1, 1, 1)
    assert t.p_value == 1.0


def test_slope_ci_by_hand():
    # x = 1..5, y = 2 4 5 4 5: b = Sxy/Sxx = 6/10, SSE = 2.4, se = sqrt(2.4/3/10), t(0.975, 3) = 3.182446.
    e = slope_ci([1, 2, 3, 4, 5], [2, 4, 5, 4, 5])
    half = 3.182446305284263 * math.sqrt(0.08)
    assert e.value == pytest.approx(0.6)
    assert (e.lo, e.hi) == (pytest.approx(0.6 - half, abs=1e-9), pytest.approx(0.6 + half, abs=1e-9))
    assert e.n == 5


def test_slope_ci_edges():
    exact = slope_ci([0, 1, 2, 3], [1, 3, 5, 7])             # a perfect line: a zero-width interval
    assert (exact.value, exact.lo, exact.hi) == (pytest.approx(2), pytest.approx(2), pytest.approx(2))
    two = slope_ci([0, 1], [0, 1])
    assert two.value == pytest.approx(1) and math.isnan(two.lo) and math.isnan(two.hi)
    assert math.isnan(slope_ci([3, 3, 3], [1, 2, 3]).value)  # no spread in x
    assert math.isnan(slope_ci([], []).value)
    skipped = slope_ci([0, 1, 2, 3], [0, None, 2, float("nan")])
    assert skipped.n == 2 and skipped.value == pytest.approx(1)
    with pytest.raises(ValueError):
        slope_ci([1, 2], [1])


# ---- synthetic runs ---------------------------------------------------------------------

def _old_metrics(steps: int = 6) -> list[dict]:
    """Rows as the loop wrote them before the new fields."""
    return [{"step": s, "time": 0.0, "episodes": 16, "reward_mean": 0.2 + 0.05 * s, "pass_rate": 0.25 + 0.05 * s,
             "no_verdict": 0, "groups": 4, "groups_dropped": 1, "masked": 0, "flags": {"reward_hack": s % 2},
             "completion_tokens": 1000, "time_generation_s": 10.0, "time_environment_s": 2.0,
             "time_verification_s": 3.0, "time_update_s": 4.0, "verify_p50_s": 0.5, "verify_p99_s": 1.5,
             "pool_hit_rate": 0.75, "learn_loss": 0.1 - 0.01 * s, "learn_grad_norm": 1.0} for s in range(steps)]


def _new_metrics(steps: int = 6) -> list[dict]:
    rows = _old_metrics(steps)
    for m in rows:
        s = m["step"]
        passes = 4 + s
        lo, hi = wilson_interval(passes, 16)
        m.update(reward_lo=m["reward_mean"] - 0.1, reward_hi=m["reward_mean"] + 0.1,
                 pass_rate=passes / 16, pass_lo=lo, pass_hi=hi, groups_mixed=2 + s % 2, refills=s % 3,
                 time_step_s=25.0 + s, peak_rss_mb=4000.0 + 100 * s)
    return rows


EVAL_TASKS_FIRST = {"e/0": [0, 1], "e/1": [0, 1], "e/2": [1, 1], "e/3": [1, 1], "e/4": [0, 1],
                    "e/5": [0, 1], "e/6": [1, 1], "e/7": [0, 1]}
EVAL_TASKS_LAST = {"e/0": [1, 1], "e/1": [1, 1], "e/2": [1, 1], "e/3": [0, 1], "e/4": [1, 1],
                   "e/5": [0, 1], "e/6": [1, 1], "e/7": [1, 1]}


def _eval(step: int, tasks: dict, name: str | None = "held-out", run_id: str | None = None) -> dict:
    passes = sum(p for p, _ in tasks.values())
    lo, hi = wilson_interval(passes, len(tasks))
    row = {"step": step, "pass_at_1": passes / len(tasks), "lo": lo, "hi": hi, "reward_mean": passes / len(tasks),
           "episodes": len(tasks), "tasks": tasks, "name": name, "run_id": run_id or f"r1-eval-{step}"}
    return {k: v for k, v in row.items() if v is not None}


def _new_evals() -> list[dict]:
    mid = dict(EVAL_TASKS_FIRST, **{"e/0": [1, 1]})
    return [_eval(-1, EVAL_TASKS_FIRST), _eval(2, mid), _eval(5, EVAL_TASKS_LAST),
            _eval(-1, {"h/0": [0, 1], "h/1": [1, 1]}, name="humaneval", run_id="r1-he--1"),
            _eval(5, {"h/0": [1, 1], "h/1": [1, 1]}, name="humaneval", run_id="r1-he-5")]


def _svgs(doc: str) -> list[ET.Element]:
    return [ET.fromstring(s) for s in re.findall(r"<svg.*?</svg>", doc, flags=re.S)]


def _h2(doc: str) -> list[str]:
    return re.findall(r"<h2>(.*?)</h2>", doc)


def test_new_fields_render_every_section():
    doc = build_report(_new_metrics(), _new_evals(), MANIFEST).to_html()
    titles = _h2(doc)
    for t in ("Did it learn?", "Train reward per step", "Train pass rate per step",
              "Groups per step: mixed, refilled, dropped", "Held-out pass@1 at each evaluation (95% CI)",
              "Held-out evaluations", "Before / after: first vs last evaluation", "Tasks that changed",
              "Time per step", "Time split (seconds, summed over steps)", "Peak memory (RSS) per step",
              "Reward latency (verifier)", "Loss and gradient norm", "Detector flags by kind", "Steps"):
        assert t in titles, t
    assert titles.index("Did it learn?") < titles.index("Train reward per step") < titles.index("Steps")
    # Reward rises 0.05 per step exactly: slope 0.05 with a zero-width interval.
    assert "+0.0500 [+0.0500, +0.0500]" in doc
    assert "rising (the interval is above 0)" in doc
    # held-out: 3/8 -> 6/8; gained e/0 e/1 e/4 e/7, lost e/3, 3 unchanged; p = 2 (1 + 5) / 32.
    assert "37.5%" in doc and "75.0%" in doc
    assert "4 task(s) gained, 1 lost, 3 unchanged; sign test p = 0.375" in doc
    assert "+37.5" in doc                                     # points
    # humaneval is its own set, compared on its own.
    assert "humaneval: pass@1 50.0%" in doc and "1 task(s) gained, 0 lost, 1 unchanged; sign test p = 1" in doc
    changed = doc[doc.index("<h2>Tasks that changed</h2>"):]
    changed = changed[:changed.index("</section>")]
    assert re.findall(r"<td >(e/\d|h/\d)</td>", changed) == ["e/0", "e/1", "e/4", "e/7", "e/3", "h/0"]
    assert "gained" in changed and "lost" in changed
    # Headline numbers.
    assert "4,500 MiB" in doc                                  # peak RSS, max over steps
    assert "4 / 1 (p=0.375)" in doc
    # Time: other = 25 + s - (10 + 3 + 2 + 4) = 6 + s; summed over 6 steps = 51.
    assert "51 s" in doc
    assert "episodes of this task" not in doc                 # no store given: no episodes section


def test_charts_have_interval_bands_and_a_fit():
    doc = build_report(_new_metrics(), _new_evals(), MANIFEST).to_html()
    svgs = _svgs(doc)
    reward, passes, held = svgs[0], svgs[1], svgs[3]
    assert len(reward.findall(f"{SVG}polygon")) == 1            # the reward CI band
    fit = [p for p in reward.findall(f"{SVG}polyline") if p.get("stroke-dasharray")]
    assert len(fit) == 1                                      # the least-squares line, dashed
    assert any(t.text == "least-squares fit (+0.05/step)" for t in reward.iter(f"{SVG}text"))
    assert len(passes.findall(f"{SVG}polygon")) == 1
    # held-out has 3 evaluations (a band); humaneval 2 (a band too).
    assert len(held.findall(f"{SVG}polygon")) == 2
    labels = {t.text for t in held.iter(f"{SVG}text")}
    assert {"held-out", "humaneval", "-1"} <= labels


def test_old_rows_still_render(tmp_path):
    old_evals = [{"step": -1, "pass_at_1": 0.25, "lo": 0.07, "hi": 0.59, "reward_mean": 0.25, "episodes": 8},
                 {"step": 5, "pass_at_1": 0.5, "lo": 0.22, "hi": 0.78, "reward_mean": 0.5, "episodes": 8}]
    path = write_report(tmp_path, _old_metrics(), old_evals, MANIFEST)
    doc = path.read_text()
    assert path == tmp_path / "report.html"
    titles = _h2(doc)
    assert "Train reward per step" in titles and "Before / after: first vs last evaluation" in titles
    assert "Tasks that changed" not in titles and "Peak memory (RSS) per step" not in titles
    assert "25.0% [7.0%, 59.0%]" in doc and "50.0% [22.0%, 78.0%]" in doc
    assert _svgs(doc)[0].find(f"{SVG}polygon") is None       # no CI fields: no band
    assert "Shaded" not in doc.split("<h2>Train pass rate per step</h2>")[1].split("</section>")[0]
    # No time_step_s: no "other" series.
    assert "other" not in {t.text for s in _svgs(doc) for t in s.iter(f"{SVG}text")}


def test_empty_run_renders():
    doc = build_report([], [], {}).to_html()
    assert "No training steps recorded." in doc and "No held-out evaluations recorded." in doc


def test_single_evaluation_and_single_step():
    doc = build_report(_new_metrics(1), [_eval(-1, EVAL_TASKS_FIRST)], MANIFEST, "/nonexistent").to_html()
    assert "one evaluation (step -1)" in doc
    assert "too few for a trend" in doc
    assert "Only one held-out evaluation" in doc


def test_parts_summed_over_concurrent_episodes_leave_other_out():
    rows = _new_metrics(3)
    rows[1]["time_step_s"] = 5.0                              # less than the 19 s of parts
    doc = build_report(rows, [], MANIFEST).to_html()
    assert "In 1 step(s) the parts add up to more than the wall time" in doc


# ---- episodes from the trajectory store ---------------------------------------------------

def _traj(run_id: str, task: str, verdict: str, text: str, i: int = 0, **kw) -> Trajectory:
    return Trajectory(episode_id=f"{run_id}:{task}:{i}", task_id=task, run_id=run_id, step=0, sample_index=i,
                      messages=[{"role": "user", "content": "solve it"}, {"role": "assistant", "content": text}],
                      verdict=verdict, reward=1.0 if verdict == "pass" else 0.0, termination="submitted", **kw)


def test_one_task_before_and_after(tmp_path):
    store = TrajectoryStore(tmp_path / "traj")
    long = "x = 1\n" * 2000
    store.write([_traj("r1-eval--1", "e/0", "fail", f"return a - b  # {EVIL}"),
                 _traj("r1-eval--1", "e/1", "fail", "nope"),
                 _traj("r1-eval-5", "e/0", "pass", long + "return a + b"),
                 _traj("r1-eval-5", "e/1", "pass", "fine")])
    doc = build_report(_new_metrics(), _new_evals(), MANIFEST, tmp_path / "traj").to_html()
    sec = doc[doc.index("<h2>One task before and after: e/0</h2>"):]
    sec = sec[:sec.index("</section>")]
    assert "failed in the first evaluation, passed in the last" in sec
    assert "fail · reward 0.000" in sec and "pass · reward 1.000" in sec
    assert "return a - b" in sec and "return a + b" in sec   # the tail of a clipped answer is kept
    assert "characters cut" in sec and len(sec) < 20_000
    assert "<script" not in doc and "&lt;script&gt;" in sec
    assert "step -1 · run r1-eval--1" in sec and "step 5 · run r1-eval-5" in sec
    assert "submitted · 1 turn(s)" in sec                     # counted from the messages when turns are empty


def test_episodes_of_old_rows_are_found_by_run_name_and_counted(tmp_path):
    """Eval rows without tasks or run_id: the run id follows the loop's naming, the
    per-task results come from the episodes; turns are preferred over messages."""
    store = TrajectoryStore(str(tmp_path / "traj"))
    store.write([_traj("r1-eval--1", "e/9", "fail", "msg", turns=[Turn(0, "first try"), Turn(1, "second try")]),
                 _traj("r1-eval--1", "e/5", "pass", "a"), _traj("r1-eval-5", "e/5", "pass", "b"),
                 _traj("r1-eval-5", "e/9", "pass", "msg", turns=[Turn(0, "solved")])])
    old = [{"step": -1, "pass_at_1": 0.5, "lo": 0.1, "hi": 0.9, "episodes": 2},
           {"step": 5, "pass_at_1": 1.0, "lo": 0.3, "hi": 1.0, "episodes": 2}]
    doc = build_report(_old_metrics(), old, MANIFEST, str(tmp_path / "traj")).to_html()
    sec = doc[doc.index("<h2>One task before and after: e/9</h2>"):]
    assert "── turn 2 ──\nsecond try" in sec and "solved" in sec
    assert "submitted · 2 turn(s)" in sec


def test_store_problems_do_not_break_the_report(tmp_path):
    doc = build_report(_new_metrics(), _new_evals(), MANIFEST, tmp_path / "empty").to_html()
    assert "One task before and after" in doc and "no episodes found" in doc
    evals = _new_evals()
    for e in evals:
        e["tasks"] = {"only-here" if e["step"] < 0 else "only-there": [1, 1]}
    doc = build_report(_new_metrics(), evals, MANIFEST, tmp_path / "empty").to_html()
    assert "No task appears in both" in doc


def test_report_builder_band_rejects_unknown_series():
    with pytest.raises(ValueError, match="unknown series"):
        Report("x").add_line_chart("c", {"a": [1, 2]}, bands={"b": [(0, 0, 1)]})


def test_wall_clock_split_when_the_loop_records_the_rollout_phase():
    metrics = _new_metrics()
    for m in metrics:
        m["time_rollout_wall_s"] = 30.0
        m["time_step_s"] = max(m.get("time_step_s") or 0.0, 30.0 + m["time_update_s"] + 2.0)
    doc = build_report(metrics, _new_evals(), {"run_id": "r"}).to_html()
    assert "Time per step (wall clock)" in doc and "rollout (wall)" in doc
    assert "Episode time by part" in doc and "Peak memory" in doc
