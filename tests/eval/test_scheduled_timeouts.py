"""The scheduler's turn and verification timeouts reach real episodes: a turn that runs past
`timeouts.turn_s` (here: a slow tool call) and a verification past `timeouts.verification_s`
end the episode with the scheduler's typed failure."""

from __future__ import annotations

import pytest

from tryloop.agent.environments import Environments
from tryloop.agent.episode import EpisodeRequest, run_episode
from tryloop.agent.scripted import Oracle, _Scripted
from tryloop.agent.trajectory import ToolCall
from tryloop.eval.scheduled import ScheduledRunner
from tryloop.scheduler.config import SchedulerConfig, TimeoutConfig
from tryloop.scheduler.failures import TurnTimeout, VerificationTimeout


class _Sleeper(_Scripted):
    name = "sleeper"

    def steps(self, task, rng):
        yield [ToolCall("shell", {"command": "sleep 5"})]


@pytest.fixture
async def envs(runtime):
    e = Environments(runtime)
    yield e
    await e.close()


async def _run(envs, task, policy, timeouts: TimeoutConfig):
    runner = ScheduledRunner(SchedulerConfig(timeouts=timeouts, seed=0))
    try:
        async def one(req, hooks):
            return await run_episode(req, policy, envs, hooks=hooks)

        done = [t async for t in runner.run([EpisodeRequest(f"{policy.name}-{task.id}", task)], one)]
    finally:
        await runner.aclose()
    return done, runner.failed


async def test_a_turn_past_the_schedulers_turn_timeout_ends_the_episode(envs, task):
    done, failed = await _run(envs, task, _Sleeper(), TimeoutConfig(turn_s=1.0))
    assert not done and len(failed) == 1
    assert failed[0].failure.type == TurnTimeout.__name__ and not failed[0].failure.no_verdict, failed[0]


async def test_a_verification_past_the_schedulers_limit_is_a_verifier_timeout(envs, task):
    done, failed = await _run(envs, task, Oracle(), TimeoutConfig(verification_s=0.05))
    assert not done and len(failed) == 1
    assert failed[0].failure.type == VerificationTimeout.__name__ and failed[0].failure.no_verdict, failed[0]
    ok, none_failed = await _run(envs, task, Oracle(), TimeoutConfig())
    assert len(ok) == 1 and not none_failed and ok[0].verdict == "pass"
