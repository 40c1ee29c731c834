"""Trajectories as the episode loop would leave them: every field set, tool calls, flags."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tryloop.agent.trajectory import Observation, ToolCall, Trajectory, Turn

MakeTrajectory = Callable[..., Trajectory]


@pytest.fixture
def make_trajectory() -> MakeTrajectory:
    def make(episode_id: str = "ep-1", **overrides: Any) -> Trajectory:
        fields: dict[str, Any] = {
            "episode_id": episode_id,
            "task_id": "calc/add-minus",
            "task_fingerprint": "f" * 64,
            "run_id": "run-1",
            "step": 3,
            "group_id": "g-3-calc",
            "sample_index": 1,
            "policy": "qwen-0.5b",
            "policy_version": "w-0003",
            "messages": [
                {"role": "system", "content": "You fix bugs."},
                {"role": "user", "content": "tests/test_calc.py::test_add fails"},
                {"role": "assistant", "content": "Let me look.",
                 "tool_calls": [{"id": "c1", "name": "shell", "arguments": {"cmd": "pytest -x"}}]},
                {"role": "tool", "tool_call_id": "c1", "name": "shell", "content": "1 failed"},
                {"role": "assistant", "content": "Fixed: a + b."},
            ],
            # Ids above 2**16 and logprobs that float32 cannot hold exactly.
            "token_ids": [151644, 8948, 198, 2610, 525, 70000, 13, 151645],
            "logprobs": [0.0, 0.0, 0.0, -0.1234567891, -2.718281828, -1e-7, -13.5, 0.0],
            "loss_mask": [0, 0, 0, 1, 1, 1, 1, 0],
            "prompt_length": 3,
            "token_source": "exact",
            "turns": [
                Turn(0, "Let me look.", [ToolCall("shell", {"cmd": "pytest -x", "n": [1, 2]}, "c1")],
                     [Observation("shell", "1 failed", ok=True, truncated=False, exit_code=1, env_s=0.75)],
                     completion_tokens=3, model_s=0.5, env_s=0.75, finish_reason="tool_calls",
                     weights_versions=["w-0003"]),
                # New weights arrived mid-turn: both versions sampled its tokens.
                Turn(1, "Fixed: a + b.", [], [], completion_tokens=1, model_s=0.25, finish_reason="stop",
                     weights_versions=["w-0003", "w-0004"]),
            ],
            "weights_versions": ["w-0003", "w-0004"],
            "changes": {"calc/__init__.py": "ZGVmIGFkZChhLCBiKTogcmV0dXJuIGEgKyBiCg==", "old.py": None},
            "termination": "submitted",
            "error": "",
            "verdict": "pass",
            "reward": 1.0,
            "reward_components": {"tests": 1.0, "format": 0.5},
            "flags": [],
            "reward_version": "rv-abc",
            "verdict_reason": "",
            "times": {"model": 0.75, "env": 0.75, "verify": 2.5, "total": 4.0},
            "created_at": 1_700_000_000.25,
            "meta": {"seed": 7, "tags": ["a", "ü"], "nested": {"x": None}},
        }
        fields.update(overrides)
        return Trajectory(**fields)

    return make
