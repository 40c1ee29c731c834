"""`tryloop dashboard`: a live web page over the runs under `store.runs_dir` and the episodes in the
trajectory store (docs/dashboard.md).

    GET /                                   the page (one HTML file, inline JS and SVG, no external asset)
    GET /api/runs                           every run: train / eval runs of runs_dir, episode runs of the store
    GET /api/runs/{run}                     one run: headline, charts (learning curves with intervals, the time
                                            split of each step, held-out pass@1), flags, live state, warnings
    GET /api/runs/{run}/trajectories        its episodes, one summary row each (?step=N: one step)
    GET /api/trajectories/{episode}         one episode: turns, tool calls and outputs, the diff, the verdict
                                            (?run=&step= find it without the listing's index)
    GET /runs/{run}/report.html             the run's static report, once written
    GET /health                             liveness (no auth)

Everything is read on request and cheaply: metrics.jsonl and evals.jsonl are read from where the
last request stopped (a file rewritten by a resume is read again), committed trajectory parts are
read once (they never change) and only their summary columns; the page polls every `refresh_s`.
A line that does not parse is skipped and named (file and line) in the run's warnings, and so is
an unfinished last line that is not text and a trajectory part that cannot be read.
"""

from __future__ import annotations

import base64
import contextlib
import difflib
import json
import math
import os
import statistics
import threading
import time
from importlib import resources
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from tryloop.errors import TryloopError
from tryloop.serve.asgi import AccessLog, access_logger, authorized, bearer_token
from tryloop.telemetry.live import STATE_FILE

Row = dict[str, Any]

_LIST_COLUMNS = ["episode_id", "task_id", "sample_index", "group_id", "verdict", "reward", "termination",
                 "flag_kinds", "num_turns", "completion_tokens", "times", "created_at", "policy_version",
                 "written_at_ns"]
_MAX_EPISODES = 2000          # rows of one listing (the newest kept)
_DIFF_CHARS = 200_000         # of one episode's diff
_TEXT_CHARS = 20_000          # of one turn's text or one tool output


class NotFound(Exception):
    pass


def _num(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _clean(x: Any) -> Any:
    """JSON-safe: NaN and infinities become null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_clean(v) for v in x]
    return x


class JsonlTail:
    """A JSON-lines file read incrementally: each call reads only what was appended since the last
    one (a line still being written waits for its newline); a file replaced or shortened is read
    again from the start. Lines that do not parse are kept out of `rows` and named in `errors`."""

    def __init__(self, path: Path):
        self.path = path
        self._reset(None)
        self._lock = threading.Lock()

    def _reset(self, ident: tuple[int, int] | None) -> None:
        self.ident, self.offset, self.line_no, self.pending = ident, 0, 0, b""
        self.rows: list[Row] = []
        self.errors: list[dict[str, Any]] = []

    def read(self) -> tuple[list[Row], list[dict[str, Any]]]:
        with self._lock:
            try:
                st = os.stat(self.path)
            except FileNotFoundError:
                self._reset(None)
                return [], []
            ident = (st.st_dev, st.st_ino)
            if ident != self.ident or st.st_size < self.offset:
                self._reset(ident)
            if st.st_size > self.offset:
                with open(self.path, "rb") as f:
                    f.seek(self.offset)
                    data = f.read(st.st_size - self.offset)
                end = data.rfind(b"\n") + 1       # a line without its newline is still being written
                self.pending = data[end:]
                for raw in data[:end].split(b"\n")[:-1]:
                    self.line_no += 1
                    if not raw.strip():
                        continue
                    try:
                        row = json.loads(raw)
                        if not isinstance(row, dict):
                            raise ValueError(f"a {type(row).__name__}, not an object")
                    except ValueError as e:
                        self.errors.append({"file": str(self.path), "line": self.line_no,
                                            "error": f"skipped, does not parse: {type(e).__name__}: {e}"[:300]})
                        continue
                    self.rows.append(row)
                self.offset += end
            return list(self.rows), list(self.errors) + self._pending_error()

    def _pending_error(self) -> list[dict[str, Any]]:
        """An unfinished last line that can never become one (not UTF-8 text), named: the file
        would otherwise look empty. A line still being written waits without a warning; this one
        is not kept in `errors` either, since the file may yet be rewritten."""
        import codecs

        try:
            codecs.getincrementaldecoder("utf-8")().decode(self.pending, final=False)
            return []
        except UnicodeDecodeError as e:
            return [{"file": str(self.path), "line": self.line_no + 1,
                     "error": f"not read: not UTF-8 text ({e.reason}), and no newline at its end"}]


class Dashboard:
    """What the page shows, read from the run directories and the trajectory store."""

    def __init__(self, runs_dir: str | Path, trajectories_url: str | None, tasks_url: str | None = None,
                 metrics_urls: list[str] | None = None):
        self.runs_dir = Path(runs_dir)
        self.metrics_urls = list(metrics_urls or [])
        self.trajectories_url = trajectories_url
        self.tasks_url = tasks_url
        self._tails: dict[Path, JsonlTail] = {}
        self._parts: dict[str, list[Row]] = {}          # committed part -> its summary rows (parts never change)
        self._where: dict[str, tuple[str, int]] = {}     # episode id -> (run, step), from listings
        self._store = None
        self._tasks = None
        self._lock = threading.Lock()

    # ---- sources -------------------------------------------------------------------

    def store(self):
        """The trajectory store, or None while a local one does not exist (it is not created)."""
        if self._store is None and self.trajectories_url:
            from tryloop.errors import InputMissing
            from tryloop.store.trajectories import TrajectoryStore

            with contextlib.suppress(InputMissing):   # none written yet: the dashboard shows live runs only
                self._store = TrajectoryStore(self.trajectories_url, create=False)
        return self._store

    def _tail(self, path: Path) -> tuple[list[Row], list[dict[str, Any]]]:
        with self._lock:
            tail = self._tails.setdefault(path, JsonlTail(path))
        return tail.read()

    def _store_runs(self) -> dict[str, list[int]]:
        st = self.store()
        if st is None:
            return {}
        from urllib.parse import unquote

        out: dict[str, list[int]] = {}
        for path in st.fs.glob(f"{st.base}/run=*/step=*"):
            run_part, _, step_part = path.rstrip("/").rpartition("/")
            run = unquote(run_part.rpartition("/run=")[2])
            with contextlib.suppress(ValueError):
                out.setdefault(run, []).append(int(step_part.removeprefix("step=")))
        return {k: sorted(v) for k, v in out.items()}

    def _run_dirs(self) -> list[Path]:
        if not self.runs_dir.is_dir():
            return []
        return sorted(p for p in self.runs_dir.iterdir() if p.is_dir() and not p.name.startswith("."))

    # ---- runs ----------------------------------------------------------------------

    def runs(self) -> list[Row]:
        store_runs = self._store_runs()
        out: dict[str, Row] = {}
        for d in self._run_dirs():
            kind = "train" if (d / "metrics.jsonl").exists() or (d / "manifest.json").exists() else \
                "eval" if (d / "summary.json").exists() else None
            if kind is None and not (d / STATE_FILE).exists():
                continue
            files = [d / n for n in ("metrics.jsonl", "evals.jsonl", "summary.json", STATE_FILE, "report.html")]
            mtime = max((f.stat().st_mtime for f in files if f.exists()), default=d.stat().st_mtime)
            state = self._state(d)
            out[d.name] = {"id": d.name, "kind": kind or "eval", "dir": str(d), "updated": mtime,
                           "live": bool(state and state.get("live_now")), "parent": None,
                           "steps": None, "trajectory_steps": len(store_runs.get(d.name, []))}
            if kind == "train":
                rows, _ = self._tail(d / "metrics.jsonl")
                out[d.name]["steps"] = len(rows)
                evals, _ = self._tail(d / "evals.jsonl")
                for e in evals:
                    rid = e.get("run_id")
                    if isinstance(rid, str) and rid not in out:
                        out[rid] = {"id": rid, "kind": "eval", "parent": d.name}
        for run, steps in store_runs.items():
            row = out.setdefault(run, {"id": run, "parent": None,
                                       "kind": "serve" if run.startswith("serve-") else "episodes"})
            row.setdefault("dir", None)
            row.setdefault("updated", None)
            row.setdefault("live", False)
            row.setdefault("steps", None)
            row["trajectory_steps"] = len(steps)
        for url in self.metrics_urls:
            sid = _source_id(url)
            out.setdefault(sid, {"id": sid, "kind": "server", "parent": None, "dir": url, "live": True,
                                 "trajectory_steps": 0})
        for row in out.values():
            for k in ("dir", "updated", "steps"):
                row.setdefault(k, None)
            row.setdefault("live", False)
            row.setdefault("trajectory_steps", len(store_runs.get(row["id"], [])))
        return sorted(out.values(), key=lambda r: (r["parent"] or r["id"], r["parent"] is not None, r["id"]))

    def _state(self, d: Path) -> Row | None:
        p = d / STATE_FILE
        try:
            doc = json.loads(p.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(doc, dict):
            return None
        age = time.time() - float(doc.get("time") or 0)
        doc["age_s"] = round(age, 1)
        # Live: the run said so and wrote within a few of its periods (a killed run stops writing).
        doc["live_now"] = bool(doc.get("live")) and age < 5 * float(doc.get("every_s") or 2.0) + 10
        return doc

    def run(self, run_id: str) -> Row:
        known = {r["id"]: r for r in self.runs()}
        if run_id not in known:
            raise NotFound(f"no run {run_id!r} in {self.runs_dir} or the trajectory store "
                           f"{self.trajectories_url}")
        info = known[run_id]
        d = self.runs_dir / run_id
        warnings: list[dict[str, Any]] = []
        metrics: list[Row] = []
        evals: list[Row] = []
        manifest: Row = {}
        summary: Row | None = None
        if info.get("dir") and info["kind"] != "server":
            metrics, errs = self._tail(d / "metrics.jsonl")
            warnings += errs
            evals, errs = self._tail(d / "evals.jsonl")
            warnings += errs
            manifest = self._json(d / "manifest.json", warnings) or {}
            summary = self._json(d / "summary.json", warnings)
        metrics = sorted((m for m in metrics if _num(m.get("step"))), key=lambda m: m["step"])
        state = None
        if info["kind"] == "server":
            state = _scrape(info["dir"], warnings)
            info = {**info, "live": state is not None}
        elif info.get("dir"):
            state = self._state(d)
        doc: Row = {"run": info, "manifest": _manifest_view(manifest), "summary": _summary_view(summary),
                    "metrics": metrics, "evals": evals, "warnings": warnings,
                    "state": _state_view(state), "report": (d / "report.html").exists()}
        doc.update(_train_view(metrics, evals, manifest))
        if not metrics and info["kind"] != "server":   # eval, serve, episode runs: curves from their episodes
            doc.update(_episodes_view(self.trajectories(run_id, limit=None, warnings=warnings)))
        return _clean(doc)

    @staticmethod
    def _json(path: Path, warnings: list[dict[str, Any]]) -> Row | None:
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            warnings.append({"file": str(path), "line": None,
                             "error": f"does not parse: {type(e).__name__}: {e}"[:300]})
            return None

    # ---- episodes ------------------------------------------------------------------

    def trajectories(self, run_id: str, step: int | None = None, limit: int | None = _MAX_EPISODES,
                     warnings: list[dict[str, Any]] | None = None) -> list[Row]:
        """Summary rows of the run's stored episodes (each once: its latest write), newest last; the
        newest `limit` of them (None: all). A part that cannot be read is left out and named in
        `warnings`: the others are still shown."""
        st = self.store()
        if st is None:
            return []
        parts = st.parts(run_id, step)
        best: dict[str, tuple[tuple[int, str, int], Row]] = {}
        for part in parts:
            rows = self._parts.get(part.path)
            if rows is None:
                try:
                    table = st._read(part, _LIST_COLUMNS)
                except TryloopError as e:     # not cached: a part repaired or replaced is read again
                    if warnings is not None:
                        warnings.append({"file": part.path, "line": None, "error": f"skipped: {e}"[:300]})
                    continue
                rows = table.to_pylist()
                for r in rows:
                    r["step"] = part.step
                    r["run_id"] = part.run_id
                    r["times"] = dict(r.get("times") or [])
                    r["flag_kinds"] = r.get("flag_kinds") or []
                self._parts[part.path] = rows
            for i, r in enumerate(rows):
                key = (r["written_at_ns"], part.path, i)
                if r["episode_id"] not in best or key > best[r["episode_id"]][0]:
                    best[r["episode_id"]] = (key, r)
        out = [r for _, r in sorted(best.values(), key=lambda kv: (kv[1]["step"], kv[0]))]
        for r in out:
            self._where[r["episode_id"]] = (r["run_id"], r["step"])
        return _clean(out[-limit:] if limit else out)

    def trajectory(self, episode_id: str, run_id: str | None = None, step: int | None = None) -> Row:
        st = self.store()
        if run_id is None and episode_id in self._where:
            run_id, step = self._where[episode_id]
        if st is None or run_id is None:
            raise NotFound(f"no episode {episode_id!r} known: list its run's episodes first, or pass ?run=&step=")
        import pyarrow.compute as pc

        found = st.read(run_id, step, where=pc.field("episode_id") == episode_id)
        if not found:
            raise NotFound(f"no episode {episode_id!r} in run {run_id!r}"
                           + (f" step {step}" if step is not None else ""))
        return _clean(self._episode_view(found[-1]))

    def _original(self, t: Any) -> tuple[dict[str, bytes] | None, str | None]:
        """The task's initial workspace files when the task store holds the task; otherwise None
        and why not (the diff then shows the new files whole)."""
        if not self.tasks_url:
            return None, "no task store was given"
        if not t.task_fingerprint:
            return None, "the episode names no task version"
        from tryloop.errors import InputMissing, TryloopError
        from tryloop.tasks.store import TaskNotFound, TaskStore

        try:
            if self._tasks is None:
                self._tasks = TaskStore(self.tasks_url, create=False)
            return self._tasks.get(t.task_fingerprint).workspace_files(), None
        except (InputMissing, TaskNotFound) as e:
            return None, str(e)
        except (TryloopError, OSError, ValueError) as e:   # there but unreadable (a corrupt store, a
            # task that no longer loads): said, not taken for "absent"
            return None, f"the task's files in {self.tasks_url} could not be read: {e}"

    def _episode_view(self, t: Any) -> Row:
        turns = []
        for turn in t.turns:
            turns.append({
                "index": turn.index, "text": _clip(turn.text), "finish_reason": turn.finish_reason,
                "completion_tokens": turn.completion_tokens, "model_s": turn.model_s, "env_s": turn.env_s,
                "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in turn.tool_calls],
                "observations": [{"name": o.name, "content": _clip(o.content), "ok": o.ok, "truncated": o.truncated,
                                  "exit_code": o.exit_code, "env_s": o.env_s} for o in turn.observations]})
        return {
            "episode_id": t.episode_id, "run_id": t.run_id, "step": t.step, "task_id": t.task_id,
            "task_fingerprint": t.task_fingerprint, "group_id": t.group_id, "sample_index": t.sample_index,
            "policy": t.policy, "policy_version": t.policy_version, "termination": t.termination,
            "error": _clip(t.error), "verdict": t.verdict, "reward": t.reward,
            "reward_components": t.reward_components, "flags": t.flags, "reward_version": t.reward_version,
            "verdict_reason": _clip(t.verdict_reason), "times": t.times, "created_at": t.created_at,
            "prompt_length": t.prompt_length, "completion_tokens": t.completion_tokens,
            "num_tokens": len(t.token_ids), "token_source": t.token_source, "turns": turns,
            "messages": len(t.messages), "diff": _diff(t.changes, *self._original(t)),
        }


def _source_id(url: str) -> str:
    """A /metrics endpoint's name in the run list: its host and port (and path, when not /metrics)."""
    from urllib.parse import urlsplit

    u = urlsplit(url)
    return u.netloc + ("" if u.path in ("", "/metrics") else u.path)


def _scrape(url: str, warnings: list[dict[str, Any]]) -> Row | None:
    """A /metrics endpoint's samples as a live state; None (and a warning) when it does not answer."""
    import httpx

    from tryloop.telemetry.live import parse_exposition

    try:
        r = httpx.get(url, timeout=3.0)
        r.raise_for_status()
        metrics = parse_exposition(r.text)
    except (httpx.HTTPError, ValueError) as e:
        warnings.append({"file": url, "line": None, "error": f"cannot read the metrics: {type(e).__name__}: {e}"[:300]})
        return None
    return {"time": time.time(), "age_s": 0.0, "live": True, "live_now": True, "pid": None, "metrics": metrics}


def _clip(s: str | None, n: int = _TEXT_CHARS) -> str:
    s = s or ""
    return s if len(s) <= n else f"{s[: n // 2]}\n… [{len(s) - n:,} characters cut] …\n{s[-n // 2:]}"


def _diff(changes: dict[str, str | None], original: dict[str, bytes] | None,
          why: str | None = None) -> dict[str, Any]:
    """A unified diff of the judged workspace against the task's initial files (whole new files when
    they are not at hand: `why`)."""
    out, files = [], []
    for path in sorted(changes):
        enc = changes[path]
        new = None if enc is None else base64.b64decode(enc)
        old = (original or {}).get(path)
        status = "deleted" if new is None else "modified" if old is not None else \
            ("added" if original is not None else "changed")
        files.append({"path": path, "status": status})
        a = (old or b"").decode("utf-8", "replace").splitlines(keepends=True)
        b = (new or b"").decode("utf-8", "replace").splitlines(keepends=True)
        if (new is not None and b"\0" in new[:8000]) or (old is not None and b"\0" in old[:8000]):
            out.append(f"Binary file {path} {status}\n")
            continue
        lines = list(difflib.unified_diff(a, b, f"a/{path}" if old is not None else "/dev/null",
                                          f"b/{path}" if new is not None else "/dev/null"))
        out.append("".join(x if x.endswith("\n") else x + "\n" for x in lines))
    text = "".join(out)
    if len(text) > _DIFF_CHARS:
        text = text[:_DIFF_CHARS] + f"\n… [{len(text) - _DIFF_CHARS:,} characters cut]\n"
    return {"files": files, "text": text, "against": "task" if original is not None else None,
            "why": None if original is not None else why}


# ---- views: what the page draws, built with the run report's own helpers ------------------

def _manifest_view(m: Row) -> Row:
    keep = ("run_id", "code_revision", "verifier_code", "reward_spec_version", "image", "check_tasks")
    out = {k: m[k] for k in keep if k in m}
    out["train_tasks"] = len(m.get("train_tasks") or [])
    out["eval_tasks"] = len(m.get("eval_tasks") or [])
    train = (m.get("config") or {}).get("train") or {}
    out["config"] = {k: train[k] for k in ("steps", "tasks_per_step", "group_size", "eval_every", "seed")
                     if k in train}
    if isinstance(train.get("policy"), dict):
        out["config"]["policy"] = train["policy"].get("name")
    if isinstance(train.get("algo"), dict):
        out["config"]["estimator"] = train["algo"].get("estimator")
    return out


def _summary_view(s: Row | None) -> Row | None:
    if not isinstance(s, dict):
        return None
    return {k: v for k, v in s.items() if not isinstance(v, list) or len(v) <= 50}


def _state_view(state: Row | None) -> Row | None:
    """The live state's samples, grouped by part (scheduler, pools, sessions, train)."""
    if state is None:
        return None
    groups: dict[str, list[Row]] = {}
    names = {"tryloop_scheduler_": "scheduler", "tryloop_pool_": "pool", "tryloop_serve_": "sessions",
             "tryloop_train_": "train", "tryloop_model_": "model", "vllm:": "model"}
    metrics = state.get("metrics") or {}

    def label_text(s: Row) -> str:
        return ", ".join(f"{k}={v}" for k, v in sorted((s.get("labels") or {}).items()))

    for name, samples in sorted(metrics.items()):
        group = next((g for p, g in names.items() if name.startswith(p)), None)
        if group is None or not isinstance(samples, list) or name.endswith("_sum"):
            continue
        short = name
        for p in names:
            short = short.removeprefix(p)
        # A histogram's _count and _sum: one row, its mean over the count.
        sums = {label_text(s): s.get("value") for s in metrics.get(name[:-6] + "_sum", []) or []
                if isinstance(s, dict)} if name.endswith("_count") else {}
        for s in samples:
            if not isinstance(s, dict):
                continue
            labels, value = label_text(s), s.get("value")
            row = {"name": short, "labels": labels, "value": value}
            if labels in sums and _num(value) and _num(sums[labels]):
                row = {"name": short[:-6] + " (mean)", "labels": labels, "value": sums[labels] / value
                       if value else None, "n": value}
            groups.setdefault(group, []).append(row)
    return {"time": state.get("time"), "age_s": state.get("age_s"), "live": state.get("live_now"),
            "ended": not state.get("live"), "pid": state.get("pid"), "groups": groups}


def _chart(title: str, series: list[Row], *, y_label: str = "", y_range: list[float] | None = None,
           caption: str = "", kind: str = "line") -> Row:
    return {"title": title, "series": series, "y_label": y_label, "y_range": y_range, "caption": caption,
            "kind": kind}


def _series(name: str, points: list[tuple[Any, Any]], band: list[tuple[Any, Any, Any]] | None = None,
            dashed: bool = False) -> Row:
    return {"name": name, "points": [[x, y if _num(y) else None] for x, y in points],
            "band": [[x, lo, hi] for x, lo, hi in band] if band else None, "dashed": dashed}


def _train_view(metrics: list[Row], evals: list[Row], manifest: Row) -> Row:
    from tryloop.telemetry.stats import slope_ci
    from tryloop.train import report as rep

    charts: list[Row] = []
    sets = rep._eval_sets(evals)
    comparisons = {name: rep._compare(rows) for name, rows in sets.items()}
    xs = [m["step"] for m in metrics if _num(m.get("reward_mean"))]
    trend = slope_ci(xs, [m["reward_mean"] for m in metrics if _num(m.get("reward_mean"))])
    headline = rep._headline(metrics, trend, sets, comparisons) if metrics or sets else {}
    verdict = rep._verdict(metrics, trend, sets, comparisons) if metrics or sets else ""
    if metrics:
        reward = [_series("mean reward", [(m["step"], m.get("reward_mean")) for m in metrics],
                          rep._band(metrics, "reward_lo", "reward_hi"))]
        if _num(trend.value) and xs:
            ys = [m["reward_mean"] for m in metrics if _num(m.get("reward_mean"))]
            b = statistics.fmean(ys) - trend.value * statistics.fmean(xs)
            reward.append(_series(f"least-squares fit ({trend.value:+.3g}/step)",
                                  [(x, b + trend.value * x) for x in (min(xs), max(xs))], dashed=True))
        charts.append(_chart("Train reward per step", reward, y_label="mean reward",
                             caption="Shaded: 95% CI of the step's mean reward."))
        charts.append(_chart("Train pass rate per step",
                             [_series("pass rate", [(m["step"], m.get("pass_rate")) for m in metrics],
                                      rep._band(metrics, "pass_lo", "pass_hi"))],
                             y_label="pass rate", y_range=[0, 1],
                             caption="Shaded: Wilson 95% interval of the step's pass rate."))
    if sets:
        charts.append(_chart("Held-out pass@1 at each evaluation",
                             [_series(name, [(e.get("step"), e.get("pass_at_1")) for e in rows],
                                      [(e.get("step"), e.get("lo"), e.get("hi")) for e in rows])
                              for name, rows in sets.items()],
                             y_label="pass@1", y_range=[0, 1],
                             caption="One line per eval set; step -1 is before training. Shaded: 95% interval."))
    if metrics:
        charts += _time_charts(metrics)
        learn = [_series(label, [(m["step"], m.get(k)) for m in metrics])
                 for label, k in (("loss", "learn_loss"), ("grad norm", "learn_grad_norm"))
                 if any(_num(m.get(k)) for m in metrics)]
        if learn:
            charts.append(_chart("Loss and gradient norm", learn))
        groups = [_series(label, [(m["step"], m.get(k)) for m in metrics])
                  for label, k in (("groups", "groups"), ("mixed (rewards differ)", "groups_mixed"),
                                   ("refills", "refills"), ("dropped", "groups_dropped"))
                  if any(_num(m.get(k)) for m in metrics)]
        if groups:
            charts.append(_chart("Groups per step", groups, y_label="groups"))
    flags: dict[str, int] = {}
    for m in metrics:
        for k, v in (m.get("flags") or {}).items():
            if _num(v):
                flags[k] = flags.get(k, 0) + int(v)
    last = metrics[-1] if metrics else {}
    return {"headline": headline, "verdict": verdict, "charts": charts, "flags": flags,
            "last_step": {k: last.get(k) for k in ("step", "episodes", "reward_mean", "pass_rate", "time_step_s",
                                                   "pool_hit_rate", "verify_p50_s", "peak_rss_mb")
                          if k in last}}


def _time_charts(metrics: list[Row]) -> list[Row]:
    """The time split of each step, as stacked bars: wall clock (rollout, update, the rest), and
    the episodes' own time by part (summed over episodes, which overlap)."""
    from tryloop.train import report as rep

    out = []
    if any(_num(m.get("time_rollout_wall_s")) for m in metrics):
        def rest(m: Row) -> float | None:
            ks = ("time_step_s", "time_rollout_wall_s", "time_update_s")
            return max(0.0, m[ks[0]] - m[ks[1]] - m[ks[2]]) if all(_num(m.get(k)) for k in ks) else None

        out.append(_chart("Time split of each step (wall clock)",
                          [_series("rollout", [(m["step"], m.get("time_rollout_wall_s")) for m in metrics]),
                           _series("update", [(m["step"], m.get("time_update_s")) for m in metrics]),
                           _series("other", [(m["step"], rest(m)) for m in metrics])],
                          y_label="seconds", kind="stacked",
                          caption="rollout = generation, tools and verification of the step's episodes, "
                                  "overlapped; other = checkpoint, evaluation, bookkeeping."))
    parts = [(label, k) for label, k in rep._PHASES if any(_num(m.get(k)) for m in metrics)]
    if parts:
        out.append(_chart("Episode time by part per step", [_series(label, [(m["step"], m.get(k)) for m in metrics])
                                                            for label, k in parts],
                          y_label="seconds", kind="stacked",
                          caption="Generation, environment and verification summed over the step's episodes "
                                  "(they run at the same time), plus the update."))
    return out


def _episodes_view(rows: list[Row]) -> Row:
    """Runs without metrics.jsonl (eval, serve): reward and pass rate per step from their episodes."""
    from tryloop.telemetry.stats import mean_ci, wilson_interval

    by_step: dict[int, list[Row]] = {}
    flags: dict[str, int] = {}
    verdicts: dict[str, int] = {}
    for r in rows:
        by_step.setdefault(r["step"], []).append(r)
        verdicts[str(r.get("verdict"))] = verdicts.get(str(r.get("verdict")), 0) + 1
        for k in r.get("flag_kinds") or []:
            flags[k] = flags.get(k, 0) + 1
    reward, rband, rate, pband = [], [], [], []
    for step, rs in sorted(by_step.items()):
        judged = [r for r in rs if r.get("verdict") in ("pass", "fail")]
        vals = [r["reward"] for r in judged if _num(r.get("reward"))]
        mean = statistics.fmean(vals) if vals else None
        ci = mean_ci(vals) if len(vals) > 1 else None
        reward.append((step, mean))
        rband.append((step, ci.lo if ci and _num(ci.lo) else None, ci.hi if ci and _num(ci.hi) else None))
        passes = sum(r["verdict"] == "pass" for r in judged)
        lo, hi = wilson_interval(passes, len(judged)) if judged else (None, None)
        rate.append((step, passes / len(judged) if judged else None))
        pband.append((step, lo, hi))
    charts = []
    if by_step:
        charts.append(_chart("Mean reward per step", [_series("mean reward", reward, rband)], y_label="mean reward",
                             caption="From the stored episodes. Shaded: 95% CI of the mean."))
        charts.append(_chart("Pass rate per step", [_series("pass rate", rate, pband)], y_label="pass rate",
                             y_range=[0, 1], caption="Shaded: Wilson 95% interval."))
    judged = sum(v for k, v in verdicts.items() if k in ("pass", "fail"))
    headline = {"episodes": str(len(rows)), "verdicts": ", ".join(f"{k}: {v}" for k, v in sorted(verdicts.items()))}
    if judged:
        headline["pass rate"] = f"{verdicts.get('pass', 0) / judged:.1%} of {judged} judged"
    return {"charts": charts, "flags": flags, "headline": headline, "verdict": ""}


# ---- the application ------------------------------------------------------------------------

def _page() -> str:
    return resources.files("tryloop").joinpath("assets/dashboard.html").read_text()


def create_app(dashboard: Dashboard, *, refresh_s: float = 2.0, auth_token_env: str | None = None,
               access_log: str | None = None) -> Starlette:
    """The dashboard over `dashboard`'s runs; `auth_token_env` names the environment variable of the
    bearer token every request but /health must carry (the page asks for it once)."""
    token = bearer_token(auth_token_env, "serve.dashboard.auth_token_env")
    log = access_logger(access_log, "tryloop.dashboard.access")
    page = _page().replace("__REFRESH_MS__", str(int(refresh_s * 1000)))

    def guarded(fn):
        async def endpoint(request: Request) -> Response:
            if request.url.path != "/" and not authorized(request.headers, token):
                return JSONResponse({"error": "unauthorized: send Authorization: Bearer <token>"}, 401,
                                    headers={"WWW-Authenticate": "Bearer"})
            try:
                return await fn(request)
            except NotFound as e:
                return JSONResponse({"error": str(e)}, 404)
            except ValueError as e:
                return JSONResponse({"error": str(e)}, 400)
            except TryloopError as e:     # e.g. an episode in an unreadable part: the error names it
                return JSONResponse({"error": str(e)}, 500)
        return endpoint

    from starlette.concurrency import run_in_threadpool

    def _step(request: Request) -> int | None:
        raw = request.query_params.get("step")
        if raw in (None, ""):
            return None
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"step: {raw!r} is not an integer") from None

    async def index(request: Request) -> Response:
        return HTMLResponse(page, headers={"Cache-Control": "no-store"})

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def runs(request: Request) -> Response:
        return JSONResponse({"runs": await run_in_threadpool(dashboard.runs), "refresh_s": refresh_s})

    async def run(request: Request) -> Response:
        return JSONResponse(await run_in_threadpool(dashboard.run, request.path_params["run"]))

    async def metrics(request: Request) -> Response:
        doc = await run_in_threadpool(dashboard.run, request.path_params["run"])
        return JSONResponse({k: doc[k] for k in ("metrics", "evals", "warnings")})

    async def trajectories(request: Request) -> Response:
        run_id, step = request.path_params["run"], _step(request)
        known = {r["id"] for r in await run_in_threadpool(dashboard.runs)}
        if run_id not in known:
            raise NotFound(f"no run {run_id!r} in {dashboard.runs_dir} or the trajectory store "
                           f"{dashboard.trajectories_url}")
        warnings: list[dict[str, Any]] = []
        rows = await run_in_threadpool(dashboard.trajectories, run_id, step, _MAX_EPISODES, warnings)
        return JSONResponse({"run": run_id, "step": step, "trajectories": rows, "warnings": warnings})

    async def trajectory(request: Request) -> Response:
        q = request.query_params
        doc = await run_in_threadpool(dashboard.trajectory, request.path_params["episode"], q.get("run") or None,
                                      _step(request))
        return JSONResponse(doc)

    async def report(request: Request) -> Response:
        run_id = request.path_params["run"]
        path = dashboard.runs_dir / run_id / "report.html"
        if "/" in run_id or run_id.startswith(".") or not path.is_file():
            raise NotFound(f"no report for run {run_id!r}")
        return FileResponse(path, media_type="text/html")

    app = Starlette(routes=[
        Route("/", guarded(index)),
        Route("/health", health),
        Route("/api/runs", guarded(runs)),
        Route("/api/runs/{run:path}/trajectories", guarded(trajectories)),
        Route("/api/runs/{run:path}/metrics", guarded(metrics)),
        Route("/api/runs/{run:path}", guarded(run)),
        Route("/api/trajectories/{episode:path}", guarded(trajectory)),
        Route("/runs/{run:path}/report.html", guarded(report)),
    ])
    app.state.dashboard = dashboard
    return AccessLog(app, log)  # type: ignore[return-value]


def dashboard_for(cfg) -> tuple[Dashboard, Any]:
    """The Dashboard and its section of `cfg` (a TryloopConfig)."""
    dcfg = cfg.serve.dashboard
    return Dashboard(cfg.store.runs_dir, cfg.store.trajectories_url, cfg.tasks.store_url, dcfg.metrics_urls), dcfg


def serve_dashboard(cfg, on_ready=None) -> None:
    """Serve in the foreground until Ctrl-C (docs/dashboard.md)."""
    import uvicorn

    from tryloop.serve.asgi import run_server

    dash, dcfg = dashboard_for(cfg)
    app = create_app(dash, refresh_s=dcfg.refresh_s, auth_token_env=dcfg.auth_token_env,
                     access_log=dcfg.access_log)
    server = uvicorn.Server(uvicorn.Config(app, host=dcfg.host, port=dcfg.port, log_level="warning",
                                           lifespan="off"))
    run_server(server, setting="serve.dashboard.host / serve.dashboard.port", on_ready=on_ready)
