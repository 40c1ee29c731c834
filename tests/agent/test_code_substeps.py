"""Real episodes on a bug-fix task that declares the code sub-steps ("a test that reproduces the bug", then
"the fix passes"): the trajectory records the turn at which each was first met, and sub-step credit in
training gives each one's part to the turns up to it."""

from __future__ import annotations

import pytest

from tryloop.agent.environments import Environments
from tryloop.agent.episode import EpisodeRequest, run_episode
from tryloop.agent.scripted import DoNothing, _Scripted
from tryloop.agent.trajectory import ToolCall, Trajectory, Turn
from tryloop.train.advantages import compute_advantages, turn_rewards
from tryloop.train.config import TrainConfig


@pytest.fixture
async def envs(runtime):
    e = Environments(runtime)
    yield e
    await e.close()


class Script(_Scripted):
    """One list of tool calls per turn, then submit."""

    name = "script"

    def __init__(self, turns: list[list[ToolCall]]):
        self.turns = turns

    def steps(self, task, rng):
        yield from self.turns


def write(path: str, data: bytes) -> list[ToolCall]:
    return [ToolCall("write", {"path": path, "content": data.decode()})]


def fix_calls(task) -> list[ToolCall]:
    return [c for p, d in task.solution_files().items() for c in write(p, d)]


async def test_a_repro_test_then_the_fix_meet_both_at_their_turns(envs, repro_task, repro_test):
    script = Script([
        [ToolCall("view", {"path": "mathkit/arith.py"})],                         # 0: look
        write("test_repro.py", repro_test),                                       # 1: the repro
        [ToolCall("shell", {"command": "python3 -m pytest -q test_repro.py"})],   # 2: it fails
        fix_calls(repro_task),                                                    # 3: the fix
        [ToolCall("shell", {"command": "python3 -m pytest -q"})],                 # 4: all green
    ])
    traj = await run_episode(EpisodeRequest("repro-then-fix", repro_task), script, envs)
    assert traj.verdict == "pass", traj.verdict_reason
    assert traj.meta["substeps_first_met"] == {"step:repro": 1, "step:fix": 3}
    assert traj.meta["substep_rewards"] == pytest.approx({"step:repro": 0.25, "step:fix": 0.75})
    assert "1 failed" in traj.turns[2].observations[0].content   # the agent saw its test fail

    # Sub-step credit on this trajectory (its turns given one sampled run of tokens each): turns 0-1
    # earn both parts, 2-3 the fix's, turn 4 and the submit turn only the rest (compiles, 0.1).
    n = len(traj.turns)
    mask = [0, 0] + [1, 1, 0] * n
    real = Trajectory(episode_id="real", task_id=repro_task.id, group_id="g", verdict=traj.verdict,
                      reward=traj.reward, termination="submitted", token_ids=list(range(len(mask))),
                      logprobs=[0.0] * len(mask), loss_mask=mask, turns=[Turn(i, "") for i in range(n)],
                      meta={k: traj.meta[k] for k in ("substeps_first_met", "substep_rewards")})
    assert turn_rewards(real) == pytest.approx([1.1, 1.1, 0.85, 0.85] + [0.1] * (n - 4))
    other = Trajectory(episode_id="none", task_id=repro_task.id, group_id="g", verdict="fail", reward=0.0,
                       termination="submitted", token_ids=list(range(len(mask))), logprobs=[0.0] * len(mask),
                       loss_mask=mask, turns=[Turn(i, "") for i in range(n)])
    adv = compute_advantages([real, other], TrainConfig(substep_credit=True))
    slope = (adv.values[0] - adv.values[1]) / 1.1
    assert adv.per_turn[0] == pytest.approx([adv.values[0] + slope * (r - 1.1) for r in turn_rewards(real)])
    assert adv.per_turn[0][0] > adv.per_turn[0][2] > adv.per_turn[0][4]


async def test_a_bogus_repro_is_never_met_and_the_fix_still_counts(envs, repro_task):
    script = Script([
        write("test_repro.py", b"def test_repro():\n    assert False\n"),        # 0: fails by itself
        write("test_repro.py", b"from mathkit import factorial\n\n\ndef test_one():\n"
                               b"    assert factorial(1) == 1\n"),              # 1: passes on broken
        fix_calls(repro_task),                                                    # 2: the fix
    ])
    traj = await run_episode(EpisodeRequest("bogus-repro", repro_task), script, envs)
    assert traj.verdict == "pass", traj.verdict_reason
    assert traj.meta["substeps_first_met"] == {"step:repro": None, "step:fix": 2}
    assert traj.meta["substep_rewards"] == pytest.approx({"step:repro": 0.0, "step:fix": 0.75})
    assert traj.reward == pytest.approx(0.85)


async def test_a_repro_met_early_counts_from_then_even_if_later_broken(envs, repro_task, repro_test):
    script = Script([
        write("test_repro.py", repro_test),                                       # 0: a good repro
        write("test_repro.py", b"def test_repro():\n    assert False\n"),        # 1: spoiled again
    ])
    traj = await run_episode(EpisodeRequest("repro-spoiled", repro_task), script, envs)
    assert traj.verdict == "fail"
    # The verdict judges the final files (no repro there); the trajectory records that it was met at turn 0.
    assert traj.meta["substeps_first_met"] == {"step:repro": 0, "step:fix": None}
    assert traj.meta["substep_rewards"] == pytest.approx({"step:repro": 0.0, "step:fix": 0.0})
    nothing = await run_episode(EpisodeRequest("nothing", repro_task), DoNothing(), envs)
    assert nothing.meta["substeps_first_met"] == {"step:repro": None, "step:fix": None}
