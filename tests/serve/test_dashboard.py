"""`tryloop dashboard`: its JSON API over a real run directory and trajectory store, bad input, the
CLI, and the page itself in headless Chromium (loads the run, shows its figures, refreshes while
the run writes, no console error), with the screenshot kept in docs/img/dashboard.png."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import uvicorn
import yaml
from browser import browser_page
from dashboard_run import RUN, STEPS, build_run, write_state_file, write_step
from starlette.testclient import TestClient
from typer.testing import CliRunner

from tryloop.cli.main import app as cli
from tryloop.config import load_yaml
from tryloop.serve.asgi import server_in_thread
from tryloop.serve.dashboard import Dashboard, JsonlTail, create_app
from tryloop.store.trajectories import TrajectoryStore

DOCS_IMG = Path(__file__).resolve().parents[2] / "docs" / "img"


@pytest.fixture
def run(tmp_path):
    runs_dir, url, tasks_url = build_run(tmp_path)
    return runs_dir, url, TestClient(create_app(Dashboard(runs_dir, url, tasks_url)))


def test_runs_list_names_the_train_run_and_its_evaluations(run):
    _, _, client = run
    runs = {r["id"]: r for r in client.get("/api/runs").json()["runs"]}
    assert runs[RUN]["kind"] == "train" and runs[RUN]["steps"] == STEPS and runs[RUN]["trajectory_steps"] == STEPS
    assert runs[RUN]["live"] is True
    last_eval = runs[f"{RUN}-eval-{STEPS - 1}"]
    assert (last_eval["kind"], last_eval["parent"], last_eval["trajectory_steps"]) == ("eval", RUN, 1)
    # A run without metrics.jsonl: its curves come from its stored episodes.
    doc = client.get(f"/api/runs/{RUN}-eval-{STEPS - 1}").json()
    assert doc["headline"]["episodes"] == "4" and doc["headline"]["pass rate"] == "50.0% of 4 judged"
    rate = next(c for c in doc["charts"] if c["title"] == "Pass rate per step")["series"][0]
    assert rate["points"] == [[0, 0.5]] and rate["band"][0][1] < 0.5 < rate["band"][0][2]


def test_run_carries_curves_with_intervals_time_split_flags_and_state(run):
    runs_dir, _, client = run
    doc = client.get(f"/api/runs/{RUN}").json()
    rows = [json.loads(line) for line in (runs_dir / RUN / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in doc["metrics"]] == list(range(STEPS)) and doc["metrics"] == rows
    charts = {c["title"]: c for c in doc["charts"]}
    reward = charts["Train reward per step"]["series"][0]
    assert [p[1] for p in reward["points"]] == [m["reward_mean"] for m in rows]
    assert [b[1:] for b in reward["band"]] == [[m["reward_lo"], m["reward_hi"]] for m in rows]
    held = charts["Held-out pass@1 at each evaluation"]["series"][0]
    assert [p[0] for p in held["points"]] == [-1, STEPS - 1] and all(b[1] is not None for b in held["band"])
    split = charts["Time split of each step (wall clock)"]
    assert split["kind"] == "stacked" and [s["name"] for s in split["series"]] == ["rollout", "update", "other"]
    # rollout + update + other add up to the step's wall time
    for i, m in enumerate(rows):
        assert sum(s["points"][i][1] for s in split["series"]) == pytest.approx(m["time_step_s"])
    assert doc["flags"] == {"constant_eq": 1}
    assert doc["headline"]["steps"] == str(STEPS)
    state = doc["state"]
    assert state["live"] and {"scheduler", "pool"} <= set(state["groups"])
    assert {"name": "idle", "labels": "pool=mathkit", "value": 2.0} in state["groups"]["pool"]
    # a histogram is one row: its mean over its count
    assert {"name": "acquire_seconds (mean)", "labels": "pool=mathkit, result=hit", "value": pytest.approx(0.02),
            "n": 2.0} in state["groups"]["pool"]
    assert doc["warnings"] == []


def test_metrics_endpoint_and_incremental_reads(run):
    runs_dir, url, client = run
    assert len(client.get(f"/api/runs/{RUN}/metrics").json()["metrics"]) == STEPS
    # The run goes on: a new step appears on the next request, a half-written line waits.
    write_step(runs_dir / RUN, TrajectoryStore(url), STEPS)
    with (runs_dir / RUN / "metrics.jsonl").open("a") as f:
        f.write('{"step": 99, "rew')
    doc = client.get(f"/api/runs/{RUN}/metrics").json()
    assert [m["step"] for m in doc["metrics"]] == list(range(STEPS + 1)) and doc["warnings"] == []
    eps = client.get(f"/api/runs/{RUN}/trajectories", params={"step": STEPS}).json()["trajectories"]
    assert len(eps) == 4 and {e["step"] for e in eps} == {STEPS}


def test_a_resumed_run_rewriting_its_file_is_read_again(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0}\n{"step": 1}\n')
    tail = JsonlTail(path)
    assert [r["step"] for r in tail.read()[0]] == [0, 1]
    tmp = tmp_path / "m.tmp"
    tmp.write_text('{"step": 0}\n')
    os.replace(tmp, path)                  # what _truncate_jsonl does on resume
    assert [r["step"] for r in tail.read()[0]] == [0]


def test_a_corrupt_line_is_skipped_and_named(run):
    runs_dir, _, client = run
    path = runs_dir / RUN / "metrics.jsonl"
    lines = path.read_text().splitlines()
    lines.insert(2, '{"step": 7, "reward_mean": 0.5')    # cut short
    lines.insert(4, "[1, 2]")                            # not an object
    path.write_text("\n".join(lines) + "\n")
    doc = client.get(f"/api/runs/{RUN}").json()
    assert [m["step"] for m in doc["metrics"]] == list(range(STEPS))
    assert [(w["file"], w["line"]) for w in doc["warnings"]] == [(str(path), 3), (str(path), 5)]
    assert "JSONDecodeError" in doc["warnings"][0]["error"] and "list" in doc["warnings"][1]["error"]


def test_episode_viewer_has_turns_tool_calls_diff_and_verdict(run):
    client = run[2]
    eps = client.get(f"/api/runs/{RUN}/trajectories", params={"step": 2}).json()["trajectories"]
    flagged = next(e for e in eps if e["flag_kinds"])
    t = client.get(f"/api/trajectories/{flagged['episode_id']}").json()
    assert t["verdict"] in ("pass", "fail") and t["reward_components"].keys() == {"correctness", "brevity"}
    assert t["flags"][0]["kind"] == "constant_eq" and t["flags"][0]["severity"] == "suspicious"
    assert [c["name"] for turn in t["turns"] for c in turn["tool_calls"]] == ["shell", "write_file", "submit"]
    assert "raise NotImplementedError" in t["turns"][0]["observations"][0]["content"]
    # against the task's initial files, from the task store
    assert t["diff"]["files"] == [{"path": "gcd.py", "status": "modified"}] and t["diff"]["against"] == "task"
    assert "--- a/gcd.py\n+++ b/gcd.py\n" in t["diff"]["text"]
    assert "-    raise NotImplementedError\n+    return" in t["diff"]["text"]
    # found without the listing's index, by run and step
    runs_dir, url, _ = run
    fresh = TestClient(create_app(Dashboard(runs_dir, url)))
    r = fresh.get(f"/api/trajectories/{flagged['episode_id']}", params={"run": RUN, "step": 2})
    # without a task store the diff shows the judged files whole, and says why
    assert r.status_code == 200 and r.json()["diff"]["files"] == [{"path": "gcd.py", "status": "changed"}]
    assert r.json()["diff"]["why"] == "no task store was given"
    # a store without the task, and one that holds it but cannot read its files, say which
    import shutil

    from tryloop.tasks.store import TaskStore

    other = TaskStore(str(runs_dir.parent / "other-tasks"))
    where = {"run": RUN, "step": 2}
    why = TestClient(create_app(Dashboard(runs_dir, url, other.url))).get(
        f"/api/trajectories/{flagged['episode_id']}", params=where).json()["diff"]["why"]
    assert why.startswith(f"no task {t['task_fingerprint']!r} in the task store"), why
    tasks_url = str(runs_dir.parent / "tasks")   # build_run's
    shutil.rmtree(TaskStore(tasks_url).get(t["task_fingerprint"]).workspace_dir)
    diff = TestClient(create_app(Dashboard(runs_dir, url, tasks_url))).get(
        f"/api/trajectories/{flagged['episode_id']}", params=where).json()["diff"]
    assert diff["against"] is None and "could not be read" in diff["why"], diff


def test_bad_input_gets_clear_errors(run):
    _, _, client = run
    r = client.get("/api/runs/no-such-run")
    assert r.status_code == 404 and "no-such-run" in r.json()["error"]
    r = client.get("/api/runs/no-such-run/trajectories")
    assert r.status_code == 404 and "no-such-run" in r.json()["error"]
    r = client.get(f"/api/runs/{RUN}/trajectories", params={"step": "two"})
    assert r.status_code == 400 and "'two'" in r.json()["error"]
    r = client.get("/api/trajectories/nope", params={"run": RUN, "step": 1})
    assert r.status_code == 404 and "nope" in r.json()["error"]
    assert client.get("/runs/no-such-run/report.html").status_code == 404


def test_a_metrics_endpoint_is_a_live_source(tmp_path):
    """A /metrics endpoint (here the one `telemetry.metrics_port` serves for train and eval) is
    scraped on each request; one that does not answer is a warning, not an error."""
    from tryloop.scheduler.metrics import SchedulerMetrics
    from tryloop.telemetry.metrics_http import TelemetryConfig, serve_metrics

    with serve_metrics(TelemetryConfig(metrics_port=0)) as ep:
        sched = SchedulerMetrics(ep.registry)
        sched.queue_depth.labels(queue="ready").set(5)
        dead = "http://127.0.0.1:9/metrics"
        client = TestClient(create_app(Dashboard(tmp_path / "runs", None, metrics_urls=[ep.url, dead])))
        runs = {r["id"]: r for r in client.get("/api/runs").json()["runs"]}
        sid = ep.url.removeprefix("http://").removesuffix("/metrics")
        assert runs[sid]["kind"] == "server" and runs[sid]["dir"] == ep.url
        doc = client.get(f"/api/runs/{sid}").json()
        assert doc["run"]["live"] and doc["warnings"] == []
        assert {"name": "queue_depth", "labels": "queue=ready", "value": 5.0} in doc["state"]["groups"]["scheduler"]
        sched.queue_depth.labels(queue="ready").set(2)        # the next request sees the new value
        doc = client.get(f"/api/runs/{sid}").json()
        assert {"name": "queue_depth", "labels": "queue=ready", "value": 2.0} in doc["state"]["groups"]["scheduler"]
        doc = client.get("/api/runs/127.0.0.1:9").json()
        assert doc["run"]["live"] is False and doc["state"] is None
        assert doc["warnings"][0]["file"] == dead and "cannot read the metrics" in doc["warnings"][0]["error"]


def test_empty_dirs_and_a_missing_store_are_not_created(tmp_path):
    client = TestClient(create_app(Dashboard(tmp_path / "runs", str(tmp_path / "traj"))))
    assert client.get("/api/runs").json()["runs"] == []
    assert not (tmp_path / "traj").exists() and not (tmp_path / "runs").exists()


def test_bearer_token(run, monkeypatch):
    runs_dir, url, _ = run
    monkeypatch.setenv("DASH_TOKEN", "s3cret")
    client = TestClient(create_app(Dashboard(runs_dir, url), auth_token_env="DASH_TOKEN"))
    assert client.get("/api/runs").status_code == 401
    assert client.get("/api/runs", headers={"Authorization": "Bearer s3cret"}).status_code == 200
    assert client.get("/").status_code == 200 and client.get("/health").status_code == 200


def test_cli_flags_are_config_fields(tmp_path, monkeypatch):
    seen = {}
    monkeypatch.setattr("tryloop.serve.dashboard.serve_dashboard", lambda cfg, on_ready=None: seen.update(cfg=cfg))
    cfg_path = tmp_path / "c.yaml"
    cfg_path.write_text(yaml.safe_dump({"serve": {"dashboard": {"refresh_s": 5}}}))
    r = CliRunner().invoke(cli, ["dashboard", "--port", "0", "--host", "127.0.0.2", "--runs-dir", str(tmp_path),
                                 "--trajectories", str(tmp_path / "t"), "--config", str(cfg_path),
                                 "--metrics-url", "http://a:1/metrics", "--metrics-url", "http://b:2/metrics"])
    assert r.exit_code == 0, r.output
    cfg = seen["cfg"]
    assert (cfg.serve.dashboard.port, cfg.serve.dashboard.host, cfg.serve.dashboard.refresh_s) == (0, "127.0.0.2", 5)
    assert cfg.store.runs_dir == tmp_path and cfg.store.trajectories_url == str(tmp_path / "t")
    assert cfg.serve.dashboard.metrics_urls == ["http://a:1/metrics", "http://b:2/metrics"]
    assert load_yaml(cfg_path).serve.dashboard.host == "127.0.0.1"      # bound to loopback by default
    r = CliRunner().invoke(cli, ["dashboard", "--auth-token-env", "NO_SUCH_TOKEN_VAR"])
    assert r.exit_code != 0 and "NO_SUCH_TOKEN_VAR" in r.output


def test_page_in_headless_chromium(tmp_path):
    """The page loads the real run, shows its figures and an episode, picks up a new step while the
    run writes, and logs no console error; the screenshot goes to docs/img/dashboard.png."""
    runs_dir, url, tasks_url = build_run(tmp_path)
    app = create_app(Dashboard(runs_dir, url, tasks_url), refresh_s=0.5)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off"))
    with server_in_thread(server, what="dashboard") as base, browser_page(1400, 1000) as page:
        page.goto(base + "/")
        page.wait_for("document.querySelectorAll('#charts .chart svg path.band').length >= 3")
        text = page.evaluate("document.body.innerText")
        rows = [json.loads(line) for line in (runs_dir / RUN / "metrics.jsonl").read_text().splitlines()]
        assert RUN in text and "steps\n4" in text, text[:2000]
        assert f"last step reward\n{rows[-1]['reward_mean']:.3f}" in text, text[:2000]
        assert "Train reward per step" in text and "Time split of each step (wall clock)" in text
        assert "constant_eq" in text and "queue_depth" in text and "idle" in text
        assert page.evaluate("document.querySelectorAll('#episodes tr.ep').length") == 16
        # stacked bars: one rect per part and step
        assert page.evaluate("[...document.querySelectorAll('#charts .chart')].find(c => c.textContent"
                             ".includes('wall clock')).querySelectorAll('rect').length") == 3 * STEPS
        # A new step while the page is open: it shows without a reload.
        write_step(runs_dir / RUN, TrajectoryStore(url), STEPS)
        write_state_file(runs_dir / RUN)
        page.wait_for("document.body.innerText.includes('steps\\n5')")
        assert page.evaluate("document.querySelectorAll('#episodes tr.ep').length") == 20
        # Open the flagged episode of step 2.
        page.evaluate("[...document.querySelectorAll('#episodes tr.ep')].find(r => r.textContent"
                      ".includes('constant_eq')).click()")
        page.wait_for("document.querySelector('#diff') !== null")
        ep = page.evaluate("document.querySelector('#trajectory').innerText")
        assert "write_file" in ep and "raise NotImplementedError" in ep and "+++ b/gcd.py" in ep
        assert page.evaluate("document.querySelectorAll('#diff .del').length") == 1
        assert "correctness" in ep and "suspicious" in ep
        page.pump(1.5)                       # a few refreshes with the episode open
        assert page.evaluate("document.querySelector('#trajectory') !== null")
        assert page.errors == [], page.errors
        shots = {"dashboard.png": "window.scrollTo(0, 0)",
                 "dashboard-episode.png": "document.querySelector('#diff').scrollIntoView({block: 'end'})"}
        for name, script in shots.items():
            page.evaluate(script)
            page.pump(0.3)
            page.screenshot(tmp_path / name, full_page=False)
    for name in shots:
        png = (tmp_path / name).read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and 10_000 < len(png) < 300_000, (name, len(png))
        if os.environ.get("TRYLOOP_UPDATE_SCREENSHOTS"):     # the docs' pictures are this test's screenshots
            DOCS_IMG.mkdir(parents=True, exist_ok=True)
            (DOCS_IMG / name).write_bytes(png)


def test_the_browser_harness_sees_console_errors():
    """What `page.errors == []` above rules out: a console.error and an uncaught exception are caught."""
    with browser_page(400, 300) as page:
        page.goto("data:text/html,<script>console.error('boom'); null.x;</script><p>hi</p>")
        page.wait_for("document.readyState === 'complete'")
        page.pump(0.5)
        assert page.errors[0] == "console.error: boom" and "TypeError" in page.errors[1]


def test_an_unreadable_trajectory_part_is_named_and_the_others_are_shown(run):
    _, url, client = run
    good = client.get(f"/api/runs/{RUN}/trajectories", params={"step": 1}).json()
    assert good["warnings"] == [] and good["trajectories"]
    store = TrajectoryStore(url)
    part = store.parts(RUN, 2)[0].path
    episode = client.get(f"/api/runs/{RUN}/trajectories", params={"step": 2}).json()["trajectories"][0]
    fresh = TestClient(create_app(Dashboard(run[0], url)))       # nothing cached from the part
    Path(part).write_bytes(Path(part).read_bytes()[:100])        # cut short
    r = fresh.get(f"/api/runs/{RUN}/trajectories")
    assert r.status_code == 200 and [w["file"] for w in r.json()["warnings"]] == [part]
    assert "unreadable trajectory part" in r.json()["warnings"][0]["error"]
    assert {t["step"] for t in r.json()["trajectories"]} == set(range(STEPS)) - {2}
    # one episode of that part: an error naming it, as JSON
    r = fresh.get(f"/api/trajectories/{episode['episode_id']}", params={"run": RUN, "step": 2})
    assert r.status_code == 500 and part in r.json()["error"]
    # a run whose curves come from its episodes names the part in its warnings
    eval_run = f"{RUN}-eval-{STEPS - 1}"
    epart = store.parts(eval_run)[0].path
    Path(epart).write_bytes(b"PAR1")
    doc = fresh.get(f"/api/runs/{eval_run}").json()
    assert [w["file"] for w in doc["warnings"]] == [epart]


def test_an_unfinished_or_undecodable_last_line_is_named(run, tmp_path):
    runs_dir, _, client = run
    path = runs_dir / RUN / "metrics.jsonl"
    path.write_bytes(b"\xff\xfe")
    doc = client.get(f"/api/runs/{RUN}").json()
    assert doc["metrics"] == [] and [(w["file"], w["line"]) for w in doc["warnings"]] == [(str(path), 1)]
    assert "not UTF-8" in doc["warnings"][0]["error"]
    # after good lines; a line still being written (a multi-byte character cut in two included)
    # waits without a warning and is read once it ends
    tail = JsonlTail(tmp_path / "m.jsonl")
    (tmp_path / "m.jsonl").write_bytes(b'{"step": 0}\n\xff{"step": 1}')
    rows, errors = tail.read()
    assert [r["step"] for r in rows] == [0] and [e["line"] for e in errors] == [2]
    (tmp_path / "m.jsonl").write_bytes(b'{"step": 0}\n{"step": 1, "note": "\xc3')
    rows, errors = tail.read()
    assert [r["step"] for r in rows] == [0] and errors == []
    with open(tmp_path / "m.jsonl", "ab") as f:
        f.write(b'\xa9"}\n')
    rows, errors = tail.read()
    assert [r["step"] for r in rows] == [0, 1] and errors == []


def test_a_port_that_cannot_be_bound_names_the_field(tmp_path):
    import socket
    import subprocess
    import sys

    tryloop = Path(sys.executable).parent / "tryloop"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        for args, words in ((["--port", str(port)], "address already in use"),
                            (["--host", "999.1.1.1", "--port", "0"], "999.1.1.1:0")):
            res = subprocess.run([str(tryloop), "dashboard", "--runs-dir", str(tmp_path / "runs"),
                                  "--trajectories", str(tmp_path / "t"), *args],
                                 capture_output=True, text=True, timeout=60,
                                 env={**os.environ, "COLUMNS": "400", "NO_COLOR": "1"})
            assert res.returncode == 78, res.stderr
            assert "serve.dashboard.port" in res.stderr and words in res.stderr
            assert "Traceback" not in res.stderr
