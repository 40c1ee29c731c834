"""Progress in a log: bars become lines a person can follow, at a bounded rate."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from types import SimpleNamespace

from rich.console import Console
from rich.progress import Progress

import tryloop.cli.main  # noqa: F401  (registers the commands; importing cli.train first would cycle)
from tryloop.cli.progress import LogProgress, task_progress
from tryloop.cli.train import _eval_line, _step_line


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def logged(every_s: float = 60.0, **kw):
    out = io.StringIO()
    clock = Clock()
    prog = task_progress(Console(file=out, force_terminal=False, width=200), every_s=every_s, get_time=clock, **kw)
    return prog, clock, out


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_live_bars_and_a_log_gets_lines(monkeypatch):
    monkeypatch.delenv("TTY_INTERACTIVE", raising=False)
    live = task_progress(Console(file=Tty(), force_terminal=True))
    assert isinstance(live, Progress) and not isinstance(live, LogProgress)
    assert isinstance(task_progress(Console(file=io.StringIO(), force_terminal=False)), LogProgress)
    # Colours forced into a log (FORCE_COLOR, TTY_COMPATIBLE), and a dumb terminal: still a log.
    assert isinstance(task_progress(Console(file=io.StringIO(), force_terminal=True)), LogProgress)
    assert isinstance(task_progress(Console(file=Tty(), force_terminal=True, force_interactive=False)), LogProgress)


def test_a_bar_is_logged_at_most_once_per_interval_and_when_it_finishes():
    prog, clock, out = logged()
    with prog:
        bar = prog.add_task("measuring the learning zone", total=10, last="")
        prog.update(bar, advance=1, last="functions/a: pass")
        clock.now += 30
        prog.update(bar, advance=1, last="functions/b: fail")
        assert out.getvalue() == ""                      # less than a minute: nothing yet
        clock.now += 31
        prog.update(bar, advance=1, last="functions/c: [bold]pass")
        lines = out.getvalue().splitlines()
        assert lines == ["measuring the learning zone: 3/10 (30%) · 0:01:01 elapsed, ~0:02:22 left · "
                         "functions/c: [bold]pass"]   # markup in an item is printed as it is
        clock.now += 1
        prog.update(bar, advance=7, last="functions/j: pass")
        assert out.getvalue().splitlines()[-1].startswith("measuring the learning zone: 10/10 (100%) · 0:01:02")
    assert len(out.getvalue().splitlines()) == 2         # stopping adds nothing already said


def test_stopping_logs_where_an_unbounded_bar_got_to_and_fields_are_labelled():
    prog, clock, out = logged(labels={"rate": "pass"})
    with prog:
        bar = prog.add_task("building the functions tasks (gated)", total=None, last="", rate="-")
        for i in range(3):
            prog.update(bar, advance=1, last=f"functions/t{i}", rate=f"{i}/{i + 1}")
        clock.now += 5
    assert out.getvalue().splitlines() == [
        "building the functions tasks (gated): 3 done · 0:00:05 elapsed · pass 2/3 · functions/t2"]


def test_a_bar_that_stops_short_says_where_it_stopped_without_a_time_left():
    prog, clock, out = logged()
    with prog:
        bar = prog.add_task("episodes", total=10, last="")
        clock.now += 5
        prog.update(bar, advance=9, last="z")        # one episode failed: never counted
    assert out.getvalue().splitlines() == ["episodes: 9/10 (90%) · 0:00:05 elapsed · z"]


def test_the_time_left_counts_only_what_ran_since_the_bar_restarted():
    prog, clock, out = logged()
    with prog:
        bar = prog.add_task("x", total=10, last="")
        prog.reset(bar, total=100, completed=60, description="step 3 rollouts (resumed)", last="")
        clock.now += 60
        prog.update(bar, advance=10, last="y")       # 10 in a minute: 30 left take 3 more
    assert out.getvalue().splitlines() == ["step 3 rollouts (resumed): 70/100 (70%) · 0:01:00 elapsed, "
                                           "~0:03:00 left · y"]


def test_a_reset_bar_logs_what_it_reached_before_it_starts_over():
    prog, clock, out = logged()
    with prog:
        bar = prog.add_task("step 0 rollouts", total=4, last="")
        prog.update(bar, advance=2, last="x")
        clock.now += 10
        prog.reset(bar, total=6, completed=0, description="held-out eval (step 0)", last="")
        clock.now += 61
        prog.update(bar, advance=3, last="y")
    assert out.getvalue().splitlines() == ["step 0 rollouts: 2/4 (50%) · 0:00:10 elapsed · x",
                                           "held-out eval (step 0): 3/6 (50%) · 0:01:01 elapsed, ~0:01:01 left · y"]


def test_a_train_step_and_an_evaluation_read_as_lines():
    step = {"step": 3, "episodes": 40, "groups_mixed": 8, "groups": 10, "refills": 4, "reward_mean": 0.4125,
            "pass_rate": 0.375, "learn_loss": None, "time_rollout_wall_s": 141.6, "time_update_s": 97.2}
    assert _step_line(step) == ("step 3: 40 episodes, 8/10 groups mixed, 4 refills, reward 0.412, pass 0.375, "
                                "loss -, rollouts 142 s, update 97 s")
    assert _eval_line({"step": -1, "name": "held-out", "pass_at_1": 0.3, "lo": 0.25, "hi": 0.355}) == \
        "held-out eval (start): pass@1 30.0% [25%, 36%]"
    assert _eval_line({"step": 7, "name": "humaneval", "pass_at_1": None}) == "humaneval eval (step 7): no verdicts"


def test_the_cli_console_is_wide_in_a_pipe():
    # 80 columns squeeze the train and eval tables unreadably in a log.
    code = "from tryloop.cli.main import console; print(console.is_terminal, console.width)"
    env = {k: v for k, v in os.environ.items()
           if k not in ("COLUMNS", "FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE")}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert res.stdout.split() == ["False", "132"], res.stderr


def run_train_cli(monkeypatch, events, *, fail: BaseException | None = None) -> str:
    """`tryloop train`'s display fed a run's events, written to a log (the loop itself is tested in
    tests/train; here only what a person reading the log sees)."""
    import tryloop.cli.train as cli_train
    import tryloop.train.run as run
    from tryloop.config import TryloopConfig

    out = io.StringIO()
    monkeypatch.setattr(cli_train, "console", Console(file=out, force_terminal=False, width=132))
    monkeypatch.setattr(cli_train, "ensure_suite", lambda cfg: None)
    monkeypatch.setattr(cli_train, "ensure_gate", lambda cfg: None)
    monkeypatch.setattr(run, "check_start", lambda *a: None)

    async def train(cfg, tcfg, *, resume, hook):
        for event, data in events:
            hook(event, data)
        if fail is not None:
            raise fail
        return SimpleNamespace(report_path="/runs/train/report.html")

    monkeypatch.setattr(run, "train", train)
    try:
        cli_train._run(TryloopConfig(), resume=False)
    except KeyboardInterrupt:
        out.write("interrupted\n")
    return out.getvalue()


def episode(task_id: str, verdict: str):
    return {"trajectory": SimpleNamespace(task_id=task_id, verdict=verdict)}


STEP = {"step": 0, "episodes": 2, "groups_mixed": 1, "groups": 1, "refills": 0, "reward_mean": 0.5,
        "pass_rate": 0.5, "learn_loss": 0.01, "time_rollout_wall_s": 10.0, "time_update_s": 5.0}


def test_train_in_a_log_writes_the_zone_steps_and_evaluations_as_lines(monkeypatch):
    text = run_train_cli(monkeypatch, [
        ("zone", {"total": 2, "key": "k"}), ("zone_start", {"episodes": 2, "stored": 4}),
        ("zone_episode", episode("functions/a-0", "pass")), ("zone_episode", episode("functions/b-1", "fail")),
        ("eval_start", {"step": -1, "name": "held-out", "episodes": 1, "stored": 0}),
        ("eval_episode", episode("functions/c-2", "pass")),
        ("eval", {"step": -1, "name": "held-out", "pass_at_1": 1.0, "lo": 0.2, "hi": 1.0}),
        ("rollout", {"step": 0, "total": 2, "done": 0}),
        ("episode", episode("functions/a-0", "pass")), ("episode", episode("functions/a-0", "fail")),
        ("step", STEP)])
    lines = text.splitlines()
    assert lines[0].startswith("measuring the learning zone (4 episodes kept from before): 2/2 (100%) · ")
    assert lines[0].endswith(" · functions/b-1: fail")
    assert lines[1].startswith("held-out eval (start): 1/1 (100%)")
    assert lines[2] == "held-out eval (start): pass@1 100.0% [20%, 100%]"
    assert lines[3].startswith("step 0 rollouts: 2/2 (100%)")
    assert lines[4].startswith("step 0: 2 episodes, 1/1 groups mixed, 0 refills, reward 0.500, pass 0.500")
    assert "training — run train" in lines[5] and "held-out pass@1" in text      # the table, once, at the end
    assert text.count("┏") == 1 and lines[-1] == "report: /runs/train/report.html"


def test_an_interrupted_train_in_a_log_ends_its_table_before_the_next_line(monkeypatch):
    text = run_train_cli(monkeypatch, [("rollout", {"step": 0, "total": 2, "done": 0}),
                                       ("episode", episode("functions/a-0", "pass")), ("step", STEP)],
                         fail=KeyboardInterrupt())
    assert text.splitlines()[-1] == "interrupted" and "└" in text.splitlines()[-2]
