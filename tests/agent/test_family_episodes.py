"""Real episodes on answer-graded tasks: the oracle passes every one, do-nothing none, and the answer red
team acting through the tools is not passed; each family's environment brings its prompt and tools."""

from __future__ import annotations

import json

import pytest

from tryloop.agent.environments import Environments
from tryloop.agent.episode import EpisodeRequest, run_episode
from tryloop.agent.scripted import DoNothing, Hacker, Oracle
from tryloop.tasks.families import synthesize


@pytest.fixture
async def envs(runtime):
    e = Environments(runtime)
    yield e
    await e.close()


@pytest.fixture(scope="module")
def family_tasks(tmp_path_factory):
    root = tmp_path_factory.mktemp("family-episodes")
    return synthesize("data", root / "d", per_family=1) + synthesize("docs", root / "o", per_family=1)


async def _verdicts(envs, tasks, policy) -> dict[str, str]:
    out = {}
    for t in tasks:
        traj = await run_episode(EpisodeRequest(f"{policy.name}-{t.id}", t), policy, envs)
        out[t.id] = (traj.verdict, traj.verdict_reason)
    return out


async def test_oracle_passes_every_template_and_do_nothing_none(envs, family_tasks):
    assert len(family_tasks) == 36
    passed = await _verdicts(envs, family_tasks, Oracle())
    assert all(v == "pass" for v, _ in passed.values()), {k: v for k, v in passed.items() if v[0] != "pass"}
    failed = await _verdicts(envs, family_tasks, DoNothing())
    assert all(v == "fail" for v, _ in failed.values())


@pytest.mark.parametrize("attack", ["constant", "stale_cache", "own_check", "read_check", "edit_data"])
async def test_answer_hackers_through_the_tools_are_not_passed(envs, family_tasks, attack):
    t = family_tasks[0]
    traj = await run_episode(EpisodeRequest(f"hack-{attack}", t), Hacker(attack), envs)
    assert traj.termination == "submitted" and traj.verdict == "fail", (attack, traj.verdict_reason)


def test_each_environment_declares_its_prompt_and_tools(family_tasks, task):
    from tryloop.agent.episode import system_prompt
    from tryloop.agent.profiles import profile_for

    data, docs = family_tasks[0], family_tasks[-1]
    assert profile_for(task).name == "software" and "- sql(" not in system_prompt(task)
    assert system_prompt(task).startswith("You are a software engineer")
    assert "- sql(database: string, query: string)" in system_prompt(data) and "data analyst" in system_prompt(data)
    assert "- validate_json(" in system_prompt(docs) and "- replace(" not in system_prompt(docs)


async def test_the_sql_and_validate_json_tools_act_in_the_sandbox(envs, family_tasks):
    from tryloop.agent.scripted import _Scripted
    from tryloop.agent.trajectory import ToolCall

    data = next(t for t in family_tasks if "data/tickets.db" in t.workspace_files())
    docs = family_tasks[-1]

    class Script(_Scripted):
        name = "script"

        def __init__(self, calls):
            self.calls = calls

        def steps(self, task, rng):
            for c in self.calls:
                yield [c]

    t = await run_episode(EpisodeRequest("sql", data), Script([
        ToolCall("sql", {"database": "data/tickets.db", "query": "SELECT count(DISTINCT id) AS n FROM tickets"}),
        ToolCall("sql", {"database": "data/tickets.db", "query": "DELETE FROM tickets"}),
        ToolCall("sql", {"database": "data/tickets.db", "query": "SELEC nonsense"}),
        ToolCall("validate_json", {"path": "answer.json", "schema": "schema.json"})]), envs)
    obs = [o for turn in t.turns for o in turn.observations]
    rows = json.loads(data.solution_files()["answer.json"])["rows"]
    assert obs[0].ok and obs[0].content.splitlines() == ["n", str(rows)]
    assert not obs[1].ok and "readonly" in obs[1].content          # read-only: the data stays as it is
    assert not obs[2].ok and "syntax error" in obs[2].content
    assert not obs[3].ok and "unknown tool 'validate_json'" in obs[3].content   # not a data tool
    assert t.changes == {}

    answer = json.loads(docs.solution_files()["answer.json"])
    bad = {**answer, next(iter(answer)): 12}
    t = await run_episode(EpisodeRequest("validate", docs), Script([
        ToolCall("write", {"path": "answer.json", "content": json.dumps(bad)}),
        ToolCall("validate_json", {"path": "answer.json", "schema": "schema.json"}),
        ToolCall("write", {"path": "answer.json", "content": json.dumps(answer)}),
        ToolCall("validate_json", {"path": "answer.json", "schema": "schema.json"})]), envs)
    obs = [o for turn in t.turns for o in turn.observations]
    assert "NOT valid" in obs[1].content and f"/{next(iter(answer))}" in obs[1].content
    assert obs[3].content == "answer.json is valid against schema.json"
    assert t.verdict == "pass"


async def test_the_trajectory_records_the_turn_each_sub_step_was_first_met(envs, family_tasks):
    from tryloop.agent.scripted import _Scripted
    from tryloop.agent.trajectory import ToolCall

    t = family_tasks[0]
    gold = json.loads(t.solution_files()["answer.json"])

    class Stepwise(_Scripted):
        name = "stepwise"

        def steps(self, task, rng):
            yield [ToolCall("shell", {"command": "head -3 data/*.csv"})]
            yield [ToolCall("write", {"path": "answer.json", "content": json.dumps({"rows": gold["rows"]})})]
            yield [ToolCall("write", {"path": "answer.json", "content": json.dumps(gold)})]

    traj = await run_episode(EpisodeRequest("stepwise", t), Stepwise(), envs)
    assert traj.verdict == "pass"
    assert traj.meta["substeps_first_met"] == {"step:rows": 1, "step:answer": 2}
    # Each sub-step's part of the reward, for per-turn credit in training: the tests component, split.
    parts = traj.meta["substep_rewards"]
    assert set(parts) == {"step:rows", "step:answer"} and all(v > 0 for v in parts.values())
    assert sum(parts.values()) == pytest.approx(traj.reward_components["correctness"])
    nothing = await run_episode(EpisodeRequest("nothing", t), DoNothing(), envs)
    assert nothing.meta["substeps_first_met"] == {"step:rows": None, "step:answer": None}


@pytest.fixture(scope="module")
def ops_tasks(tmp_path_factory):
    return synthesize("ops", tmp_path_factory.mktemp("ops-episodes"), per_family=1)


async def test_oracle_fixes_a_broken_service_and_do_nothing_does_not(envs, ops_tasks):
    sample = [ops_tasks[0], ops_tasks[6], ops_tasks[-1]]            # one per tier
    passed = await _verdicts(envs, sample, Oracle())
    assert all(v == "pass" for v, _ in passed.values()), passed
    failed = await _verdicts(envs, sample, DoNothing())
    assert all(v == "fail" and "health" in why for v, why in failed.values()), failed


@pytest.mark.slow
async def test_oracle_fixes_every_fault_plan(envs, ops_tasks):
    passed = await _verdicts(envs, ops_tasks, Oracle())
    assert all(v == "pass" for v, _ in passed.values()), {k: v for k, v in passed.items() if v[0] != "pass"}
    failed = await _verdicts(envs, ops_tasks, DoNothing())
    assert all(v == "fail" for v, _ in failed.values())


@pytest.mark.parametrize("attack", ["stub_service", "fake_start"])
async def test_service_hackers_through_the_tools_are_not_passed(envs, ops_tasks, attack):
    traj = await run_episode(EpisodeRequest(f"hack-{attack}", ops_tasks[0]), Hacker(attack), envs)
    assert traj.verdict == "fail" and any(f["kind"] == "protected_path_edit" for f in traj.flags), traj.verdict_reason
