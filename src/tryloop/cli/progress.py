"""Progress a person can follow in a terminal and in a log file.

In a terminal, rich's live bars. Anywhere else (`tryloop train > run.log`, nohup,
a CI job, a Kubernetes pod's log) a live display draws nothing until it stops, so
a build or zone measurement of hours would leave the log silent: there, every
bar is written as plain lines instead — at most one per `every_s` per bar while
it advances, and one when it finishes or the display stops — each with the
count, the elapsed time, an estimate of the time left from the average rate so
far, and the bar's fields (the last episode, a pass count).
"""

from __future__ import annotations

import datetime
import os
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

EVERY_S = 60.0


def is_live(console: Console) -> bool:
    """Whether a live display reaches a person: an interactive console writing to a real terminal
    (or TTY_INTERACTIVE=1). FORCE_COLOR and TTY_COMPATIBLE make rich treat a CI job's log as a
    terminal, and a dumb terminal or TTY_INTERACTIVE=0 is none: a live display there writes
    nothing until it stops."""
    if not console.is_interactive:
        return False
    if os.environ.get("TTY_INTERACTIVE") == "1":
        return True
    isatty = getattr(console.file, "isatty", None)
    try:
        return bool(isatty is not None and isatty())
    except ValueError:                  # a closed file
        return False


def task_progress(console: Console, *, labels: dict[str, str] | None = None, every_s: float = EVERY_S,
                  **kw: Any) -> Progress:
    """A bar per task: description, bar, done/total, elapsed, the fields in `labels` (field -> label,
    e.g. {"rate": "pass"}), then the task's `last` field (its latest item). Live in a terminal,
    logged lines elsewhere."""
    labels = labels or {}
    if not is_live(console):
        return LogProgress(console=console, labels=labels, every_s=every_s, **kw)
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    *(TextColumn(f"{label} {{task.fields[{field}]}}") for field, label in labels.items()),
                    TextColumn("[dim]{task.fields[last]}"), console=console, **kw)


def _clock(seconds: float) -> str:
    return str(datetime.timedelta(seconds=int(seconds)))


class LogProgress(Progress):
    """A `Progress` that draws no live display and prints its tasks' state as lines instead."""

    def __init__(self, *, console: Console, labels: dict[str, str], every_s: float, **kw: Any) -> None:
        super().__init__(console=console, disable=True, **kw)
        self._labels = labels
        self._every_s = every_s
        self._logged: dict[TaskID, tuple[float, float]] = {}    # task -> (time, completed) of its last line
        self._base: dict[TaskID, float] = {}     # task -> what it had done when it (re)started: not this rate's

    def line(self, task_id: TaskID, *, final: bool = False) -> str:
        """The task's state; `final`: it ran as far as it will (no time left to estimate)."""
        task = self._tasks[task_id]
        if task.total is None:
            done = f"{task.completed:g} done"
        else:
            done = f"{task.completed:g}/{task.total:g}"
            if task.total:
                done += f" ({task.completed / task.total:.0%})"
        parts = [f"{task.description}: {done}", f"{_clock(task.elapsed or 0)} elapsed"]
        ran = task.completed - self._base[task_id]
        if not final and task.total is not None and ran > 0 and task.completed < task.total and task.elapsed:
            parts[-1] += f", ~{_clock(task.elapsed / ran * (task.total - task.completed))} left"
        parts += [f"{label} {task.fields[f]}" for f, label in self._labels.items() if task.fields.get(f) not in
                  (None, "")]
        if task.fields.get("last"):
            parts.append(str(task.fields["last"]))
        return " · ".join(parts)

    def _log(self, task_id: TaskID, *, final: bool = False) -> None:
        with self._lock:
            task = self._tasks.get(task_id)
            if task is None:
                return
            now = self.get_time()
            last_t, last_done = self._logged[task_id]
            if task.completed == last_done:
                return                              # nothing new since its last line
            if not (final or task.finished or now - last_t >= self._every_s):
                return
            self._logged[task_id] = (now, task.completed)
            # Under the lock: lines from two threads come out in the order of their counts.
            self.console.print(escape(self.line(task_id, final=final)), highlight=False, soft_wrap=True)

    def _started(self, task_id: TaskID) -> None:
        done = self._tasks[task_id].completed
        self._logged[task_id] = (self.get_time(), done)
        self._base[task_id] = done

    def add_task(self, *args: Any, **kw: Any) -> TaskID:
        with self._lock:                    # an RLock: rich's own method takes it again
            task_id = super().add_task(*args, **kw)
            self._started(task_id)
        return task_id

    def update(self, task_id: TaskID, **kw: Any) -> None:     # type: ignore[override]
        super().update(task_id, **kw)
        self._log(task_id)

    def advance(self, task_id: TaskID, advance: float = 1) -> None:
        super().advance(task_id, advance)
        self._log(task_id)

    def reset(self, task_id: TaskID, **kw: Any) -> None:      # type: ignore[override]
        with self._lock:
            self._log(task_id, final=True)      # the state it reached before it starts over
            super().reset(task_id, **kw)
            self._started(task_id)

    def stop(self) -> None:
        for task_id in list(self._tasks):
            self._log(task_id, final=True)
        super().stop()
