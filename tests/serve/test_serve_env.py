"""`tryloop serve env`: a real server on a real port, real sandboxes, real tasks, real verdicts."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from websockets.exceptions import InvalidStatus

from host import CGROUP_PARENT
from tryloop.config import TryloopConfig
from tryloop.serve.client import EnvClient, GymEnv, ServeError
from tryloop.serve.server import serve_in_thread, served_tasks
from tryloop.store.trajectories import TrajectoryStore
from tryloop.tasks.sources.functions import function_tasks
from tryloop.tasks.store import TaskStore

TOKEN = "s3cret-test-token"


def _config(tmp, **serve_env) -> TryloopConfig:
    return TryloopConfig.model_validate({
        "tasks": {"store_url": str(tmp / "tasks")},
        "store": {"trajectories_url": str(tmp / "trajectories")},
        "runtime": {"store_dir": str(tmp / "rt"), "state_dir": str(tmp / "state"), "cgroup_name": CGROUP_PARENT},
        "serve": {"env": {"port": 0, "access_log": str(tmp / "access.log"), **serve_env}}})


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """Two bundled function tasks in a task store, served with auth, a limit of 2 and quick reaping."""
    import os

    tmp = tmp_path_factory.mktemp("serve")
    store = TaskStore(tmp / "tasks")
    for t in function_tasks(tmp / "src", per_family=1, families=["affine", "add-suffix"]):
        store.add(t)
    os.environ["TRYLOOP_TEST_SERVE_TOKEN"] = TOKEN
    cfg = _config(tmp, auth_token_env="TRYLOOP_TEST_SERVE_TOKEN", max_sessions=2, idle_timeout_s=2.5,
                  disconnect_grace_s=1.0)
    tasks = served_tasks(cfg)
    try:
        with serve_in_thread(cfg, tasks) as url:
            yield url, tasks, tmp
    finally:
        os.environ.pop("TRYLOOP_TEST_SERVE_TOKEN", None)
    leftovers = list((tmp / "state" / "sandboxes").glob("*.json"))
    assert not leftovers, f"the server left sandboxes behind: {leftovers}"


def _auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}"}


def _answer(task) -> dict:
    """The reference solution written over the answer file, then submit: the correct answer."""
    code = task.solution_files()[task.meta.answer_file].decode()
    return {"tool_calls": [{"name": "write", "arguments": {"path": task.meta.answer_file, "content": code}},
                           {"name": "submit", "arguments": {}}]}


def _wait_for(pred, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.1)
    return False


def test_an_episode_over_the_websocket_is_judged_by_the_verifier(served):
    url, tasks, tmp = served
    task = tasks[0]
    with EnvClient(url, token=TOKEN) as env:
        r = env.reset(task.id)
        obs = r.observation
        assert not r.done and r.reward is None
        assert obs["instruction"] == task.instruction and obs["task_id"] == task.id
        assert {t["function"]["name"] for t in obs["tools"]} >= {"shell", "write", "submit"}
        r = env.step({"tool_calls": [{"name": "shell", "arguments": {"command": f"cat {task.meta.answer_file}"}}]})
        assert not r.done and r.observation["results"][0]["ok"]
        assert r.observation["results"][0]["content"].strip(), "the stub file is shown"
        r = env.step(_answer(task))
        assert r.done and r.reward is not None and r.reward > 0.9
        v = r.verdict
        assert v["state"] == "pass" and v["termination"] == "submitted"
        assert v["components"] and v["version"] and v["flags"] == []
        assert env.state()["done"] and env.state()["step_count"] == 2
    # recorded in the trajectory store before the reply, as eval records its episodes
    run_id = httpx.get(f"{url}/metadata", headers=_auth()).json()["run_id"]
    stored = [t for t in TrajectoryStore(tmp / "trajectories").read(run_id=run_id)
              if t.episode_id == obs["episode_id"]]
    assert len(stored) == 1 and stored[0].verdict == "pass" and stored[0].task_id == task.id
    assert [c.name for c in stored[0].turns[-1].tool_calls] == ["write", "submit"]


def test_a_wrong_answer_fails_and_the_gym_wrapper_reports_it(served):
    url, tasks, _ = served
    task = tasks[1]
    env = GymEnv(url, token=TOKEN, task_id=task.id)
    obs, info = env.reset(seed=0)
    assert info["task_id"] == task.id and obs["instruction"]
    obs, reward, terminated, truncated, info = env.step({"text": "I think it is fine as it is.\n"
                                                                 '<tool_call>{"name": "submit", "arguments": {}}'
                                                                 "</tool_call>"})
    env.close()
    assert terminated and not truncated
    assert info["verdict"]["state"] == "fail" and reward < 0.5


def test_auth_is_required_except_for_health(served):
    url, _, _ = served
    assert httpx.get(f"{url}/health").status_code == 200
    r = httpx.get(f"{url}/metadata")
    assert r.status_code == 401 and "bearer" in r.json()["error"]["message"].lower()
    assert httpx.get(f"{url}/metadata", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert httpx.post(f"{url}/reset", json={}).status_code == 401
    with pytest.raises(InvalidStatus) as e:
        EnvClient(url, token="wrong").connect()
    assert e.value.response.status_code == 403
    with pytest.raises(InvalidStatus):
        EnvClient(url).connect()


def test_metadata_schema_and_metrics(served):
    url, tasks, _ = served
    meta = httpx.get(f"{url}/metadata", headers=_auth()).json()
    assert {t["id"] for t in meta["tasks"]} == {t.id for t in tasks}
    schema = httpx.get(f"{url}/schema", headers=_auth()).json()
    assert set(schema) == {"action", "observation", "state"}
    assert "tool_calls" in schema["action"]["properties"]
    text = httpx.get(f"{url}/metrics", headers=_auth()).text
    for name in ("tryloop_serve_sessions ", "tryloop_serve_verify_seconds_bucket", "tryloop_pool_acquire_total",
                 "tryloop_serve_request_seconds_bucket"):
        assert name in text, name


def _scrape(url) -> dict[tuple[str, tuple], float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", headers=_auth()).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_metrics_show_the_scheduler_of_served_episodes(served):
    """Served episodes run under the scheduler: its series are on /metrics beside the sessions', and
    a real episode moves them (submitted, running, its tool and verifier runs in execution slots,
    ended done with its time per stage)."""
    url, tasks, _ = served
    before = _scrape(url)

    def delta(name, **labels):
        key = (name, tuple(sorted(labels.items())))
        return _scrape(url).get(key, 0.0) - before.get(key, 0.0)

    assert before[("tryloop_scheduler_admission_limit", ())] == 2.0       # serve.env.max_sessions
    # the execution slots: scheduler.capacity.execution_slots (the CPU count by default)
    assert before[("tryloop_scheduler_capacity_limit", (("name", "local"), ("resource", "execution")))] >= 1
    with EnvClient(url, token=TOKEN) as env:
        env.reset(tasks[0].id)
        assert delta("tryloop_scheduler_submitted_total") == 1
        assert _scrape(url)[("tryloop_scheduler_in_flight", (("stage", "running"),))] == 1
        r = env.step(_answer(tasks[0]))
        assert r.done and r.verdict["state"] == "pass"
    assert delta("tryloop_scheduler_finished_total", state="done") == 1
    for stage in ("running", "verifying", "total"):
        assert delta("tryloop_scheduler_stage_seconds_count", stage=stage) == 1, stage
    # the write tool call and the verifier each held an execution slot
    assert delta("tryloop_scheduler_capacity_wait_seconds_count", resource="execution") >= 2
    assert delta("tryloop_serve_verdicts_total", state="pass") == 1
    assert _scrape(url)[("tryloop_scheduler_in_flight", (("stage", "running"),))] == 0
    # a session closed before its end is a cancelled episode of the scheduler
    with httpx.Client(base_url=url, headers=_auth(), timeout=60) as http:
        sid = http.post("/reset", json={"task_id": tasks[1].id}).json()["observation"]["session_id"]
        assert http.post("/close", json={"session_id": sid}).status_code == 200
    assert _wait_for(lambda: delta("tryloop_scheduler_finished_total", state="cancelled") == 1)
    assert delta("tryloop_scheduler_submitted_total") == 2


def test_http_episode_and_bad_input(served):
    url, tasks, tmp = served
    task = tasks[0]
    with httpx.Client(base_url=url, headers=_auth(), timeout=120) as http:
        r = http.post("/reset", content=b"{not json")
        assert r.status_code == 400 and r.json()["error"]["code"] == "INVALID_JSON"
        r = http.post("/reset", json={"task_id": "no-such-task"})
        assert r.status_code == 422 and "reset.task_id" in r.json()["error"]["message"]
        r = http.post("/reset", json={"seed": 0, "colour": "red"})
        assert r.status_code == 422 and "reset.colour" in r.json()["error"]["message"]
        r = http.post("/step", json={"session_id": "nope", "action": {"text": "hi"}})
        assert r.status_code == 404 and "nope" in r.json()["error"]["message"]
        # no session id, or not a string: a field error, not an unknown session
        for req in (http.build_request("POST", "/step", json={"action": {"text": "hi"}}),
                    http.build_request("POST", "/step", json={"session_id": 5, "action": {"text": "hi"}}),
                    http.build_request("GET", "/state"), http.build_request("POST", "/close", json={})):
            r = http.send(req)
            assert r.status_code == 422 and "session_id" in r.json()["error"]["message"], (req.url, r.text)
        # routes and methods the server does not have: the same error shape
        r = http.get("/step")
        assert r.status_code == 405 and r.json()["error"]["code"] == "METHOD_NOT_ALLOWED"
        r = http.get("/nope")
        assert r.status_code == 404 and r.json()["error"]["code"] == "NOT_FOUND"
        r = http.post("/reset", content=b"x" * (2 << 20))
        assert r.status_code == 413 and "max_message_bytes" in r.json()["error"]["message"]

        r = http.post("/reset", json={"task_id": task.id})
        assert r.status_code == 200, r.text
        sid = r.json()["observation"]["session_id"]
        r = http.post("/step", json={"session_id": sid, "action": {"tool_calls": [{"name": 3}]}})
        assert r.status_code == 422 and "action.tool_calls.0.name" in r.json()["error"]["message"]
        r = http.post("/step", json={"session_id": sid, "action": {"tool_calls": [{"name": "teleport"}]}})
        assert r.status_code == 200 and not r.json()["observation"]["results"][0]["ok"], "an unknown tool is " \
            "the agent's mistake, answered in the observation"
        r = http.post("/step", json={"session_id": sid, "action": _answer(task)})
        assert r.json()["done"] and r.json()["observation"]["verdict"]["state"] == "pass"
        r = http.post("/step", json={"session_id": sid, "action": _answer(task)})
        assert r.status_code == 409 and "over" in r.json()["error"]["message"]
        assert http.post("/close", json={"session_id": sid}).status_code == 200
    lines = [json.loads(x) for x in (tmp / "access.log").read_text().splitlines()]
    assert any(x["kind"] == "http" and x["path"] == "/step" and x["status"] == 200 for x in lines)
    assert any(x["kind"] == "ws" and x["type"] == "step" for x in lines)


def test_concurrency_limit_and_idle_reaping(served):
    url, tasks, _ = served
    a, b = EnvClient(url, token=TOKEN), EnvClient(url, token=TOKEN)
    a.reset(tasks[0].id)
    b.reset(tasks[1].id)
    with EnvClient(url, token=TOKEN) as c:
        with pytest.raises(ServeError) as e:
            c.reset(tasks[0].id)
        assert e.value.code == "CAPACITY_REACHED" and e.value.data["max_sessions"] == 2
        r = httpx.post(f"{url}/reset", json={}, headers=_auth())
        assert r.status_code == 503 and r.headers["Retry-After"]
        # a and b say nothing for idle_timeout_s: both are reaped, and their room is free again
        assert _wait_for(lambda: httpx.get(f"{url}/health").json()["active_sessions"] == 0)
        assert c.reset(tasks[0].id).observation["instruction"]
    with pytest.raises(ServeError) as e:
        a.step({"text": "ls"})
    assert e.value.code == "SESSION_ERROR" and "reset" in str(e.value)
    a.close()
    b.close()
    text = httpx.get(f"{url}/metrics", headers=_auth()).text
    assert 'tryloop_serve_sessions_closed_total{reason="idle"} 2.0' in text
    assert 'tryloop_serve_refused_total{reason="capacity"}' in text


def test_a_client_that_vanishes_can_resume_within_the_grace_period(served):
    url, tasks, _ = served
    task = tasks[0]
    first = EnvClient(url, token=TOKEN)
    sid = first.reset(task.id).observation["session_id"]
    first._ws.close()     # the connection drops without a close message
    with EnvClient(url, token=TOKEN, session_id=sid) as again:
        assert again.state()["session_id"] == sid
        r = again.step(_answer(task))
        assert r.done and r.verdict["state"] == "pass"
    # one that does not come back is closed after disconnect_grace_s
    gone = EnvClient(url, token=TOKEN)
    gone_id = gone.reset(task.id).observation["session_id"]
    gone._ws.close()
    assert _wait_for(lambda: httpx.get(f"{url}/state", params={"session_id": gone_id},
                                       headers=_auth()).status_code == 404)
    assert _wait_for(lambda: httpx.get(f"{url}/health").json()["active_sessions"] == 0)


def test_a_client_that_vanishes_mid_step_finds_the_result_when_it_comes_back(served):
    url, tasks, _ = served
    task = tasks[0]
    first = EnvClient(url, token=TOKEN)
    sid = first.reset(task.id).observation["session_id"]
    first._ws.send(json.dumps({"type": "step", "data": {"tool_calls": [
        {"name": "shell", "arguments": {"command": "sleep 1; echo slept"}}]}}))
    first._ws.close()     # gone before the reply
    with EnvClient(url, token=TOKEN, session_id=sid) as again:
        assert _wait_for(lambda: again.state()["last"]["observation"]["turn"] == 1)
        last = again.state()["last"]["observation"]
        assert "slept" in last["results"][0]["content"]
        time.sleep(1.5)   # past the grace period: the session is this connection's now, not reaped
        r = again.step(_answer(task))
        assert r.done and r.verdict["state"] == "pass"


def test_an_oversized_websocket_message_closes_the_connection_not_the_server(served):
    from websockets.exceptions import ConnectionClosed

    url, tasks, _ = served
    env = EnvClient(url, token=TOKEN).connect()
    with pytest.raises(ConnectionClosed) as e:
        env._call({"type": "step", "data": {"text": "x" * (2 << 20)}})
    assert e.value.rcvd is not None and e.value.rcvd.code == 1009
    assert httpx.get(f"{url}/health").status_code == 200


def test_a_binary_websocket_frame_is_answered_with_an_error(served):
    """Messages are JSON text; a binary frame gets the protocol's error, and the connection and its
    session go on."""
    url, tasks, _ = served
    with EnvClient(url, token=TOKEN) as env:
        env.reset(tasks[0].id)
        env._ws.send(b"\x00\xff\xfe\x80 garbage")
        reply = json.loads(env._ws.recv(timeout=30))
        assert reply["type"] == "error" and reply["data"]["code"] == "INVALID_JSON", reply
        assert "binary" in reply["data"]["message"]
        r = env.step(_answer(tasks[0]))
        assert r.done and r.verdict["state"] == "pass"


def test_the_session_time_limit_ends_the_episode_and_judges_it(tmp_path):
    """serve.env.limits.wall_time_s: a client still thinking when it runs out gets the verdict of the
    workspace as it stands (termination timeout), not a hung session."""
    store = TaskStore(tmp_path / "tasks")
    task = function_tasks(tmp_path / "src", per_family=1, families=["affine"])[0]
    store.add(task)
    cfg = _config(tmp_path, limits={"wall_time_s": 2.0, "max_turns": 5})
    with serve_in_thread(cfg, served_tasks(cfg)) as url, EnvClient(url) as env:
        r = env.reset(task.id)
        if not r.done:   # (on a loaded machine the budget may already be gone when the sandbox comes)
            time.sleep(2.5)
            r = env.step({"tool_calls": [{"name": "shell", "arguments": {"command": "true"}}]})
        assert r.done and r.observation["termination"] == "timeout"
        assert r.verdict["state"] == "fail" and r.reward < 0.5
    assert not list((tmp_path / "state" / "sandboxes").glob("*.json"))


def test_closing_a_session_mid_step_answers_the_step_and_frees_the_room(served):
    import threading

    url, tasks, _ = served
    with httpx.Client(base_url=url, headers=_auth(), timeout=60) as http:
        sid = http.post("/reset", json={"task_id": tasks[0].id}).json()["observation"]["session_id"]
        replies = []
        slow = {"session_id": sid, "action": {"tool_calls": [{"name": "shell",
                                                               "arguments": {"command": "sleep 5"}}]}}
        t = threading.Thread(target=lambda: replies.append(http.post("/step", json=slow)))
        t.start()
        time.sleep(0.5)
        assert http.post("/close", json={"session_id": sid}).status_code == 200
        t.join(30)
        assert replies[0].status_code == 409 and "closed" in replies[0].json()["error"]["message"]
    assert _wait_for(lambda: httpx.get(f"{url}/health").json()["active_sessions"] == 0)
    time.sleep(0.3)
    assert httpx.get(f"{url}/health").json()["active_sessions"] == 0, "counted out once, not twice"
