"""Real episodes on answer-graded tasks: the oracle passes every one, do-nothing none, and the answer red
team acting through the tools is not passed; each family's environment brings its prompt and tools."""

from __future__ import annotations

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
