"""Trajectories -> tensors: the next-token shift, padding and truncation."""

from __future__ import annotations

import pytest
import torch

from tryloop.agent.trajectory import Trajectory
from tryloop.train.batch import collate


def traj(ids, lps, mask, eid="e") -> Trajectory:
    return Trajectory(episode_id=eid, task_id="t", token_ids=ids, logprobs=lps, loss_mask=mask)


# prompt 10 11 | sampled 12 13 | tool output 14 | sampled 15
A = traj([10, 11, 12, 13, 14, 15], [0.0, 0.0, -0.5, -0.7, 0.0, -0.2], [0, 0, 1, 1, 0, 1], "a")
B = traj([20, 21, 22], [0.0, -1.0, -2.0], [0, 1, 1], "b")


def test_shift_aligns_targets():
    b = collate([A, B], [2.0, -1.0], pad_id=0)
    assert b.input_ids.tolist() == [[10, 11, 12, 13, 14, 15], [20, 21, 22, 0, 0, 0]]
    assert b.attention_mask.tolist() == [[1] * 6, [1, 1, 1, 0, 0, 0]]
    # Column j is about target token j+1.
    assert b.loss_mask.tolist() == [[0, 1, 1, 0, 1], [1, 1, 0, 0, 0]]
    assert b.old_logprobs.tolist() == [pytest.approx([0, -0.5, -0.7, 0, -0.2]), [-1.0, -2.0, 0, 0, 0]]
    assert b.advantages.tolist() == [[0, 2, 2, 0, 2], [-1, -1, 0, 0, 0]]
    assert (b.size, b.tokens, b.truncated) == (2, 5, 0)


def test_truncation_drops_the_tail_and_its_masks():
    b = collate([A, B], [1.0, 1.0], max_length=4, pad_id=7)
    assert b.input_ids.tolist() == [[10, 11, 12, 13], [20, 21, 22, 7]]
    assert b.loss_mask.tolist() == [[0, 1, 1], [1, 1, 0]]
    assert b.old_logprobs[0].tolist() == pytest.approx([0, -0.5, -0.7])
    assert b.truncated == 1


def test_policy_token_at_position_zero_is_never_a_target():
    t = traj([5, 6], [-0.1, -0.3], [1, 1])
    b = collate([t], [1.0])
    assert b.loss_mask.tolist() == [[1.0]] and b.old_logprobs.tolist() == [pytest.approx([-0.3])]


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="differ in length"):
        collate([traj([1, 2, 3], [0.0, 0.0], [0, 1, 1], "bad")], [1.0])
    with pytest.raises(ValueError, match="empty"):
        collate([], [])
    with pytest.raises(ValueError, match="advantages"):
        collate([A], [1.0, 2.0])
    with pytest.raises(ValueError, match="fewer than two"):
        collate([traj([1], [0.0], [0])], [1.0])


def test_to_device_keeps_everything():
    b = collate([A], [1.0]).to("cpu")
    assert b.input_ids.dtype == torch.long and b.loss_mask.dtype == torch.float32


def test_per_turn_advantages_land_on_each_turns_tokens():
    from tryloop.agent.trajectory import Turn

    mask = [0, 0, 1, 1, 0, 0, 1, 0, 1, 1]
    t = Trajectory(task_id="t", episode_id="e", token_ids=list(range(10)), logprobs=[0.0] * 10, loss_mask=mask,
                   turns=[Turn(i, "") for i in range(3)])
    b = collate([t], [[0.5, -1.0, 2.0]])
    # column j is target token j+1: tokens 2-3 (turn 0), 6 (turn 1), 8-9 (turn 2)
    assert b.advantages[0].tolist() == [0, 0.5, 0.5, 0, 0, -1.0, 0, 2.0, 2.0]
    with pytest.raises(ValueError, match="2 turn advantages for 3 sampled turns"):
        collate([t], [[1.0, 2.0]])
