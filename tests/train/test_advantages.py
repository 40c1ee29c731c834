"""Advantage estimators and the episode rules, against numbers worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from tryloop.agent.trajectory import Trajectory
from tryloop.rewards.spec import RewardSpec
from tryloop.rewards.verdict import Flag
from tryloop.train.advantages import (
    ESTIMATORS,
    compute_advantages,
    dr_grpo,
    get_estimator,
    grpo,
    informative,
    rloo,
)
from tryloop.train.config import TrainConfig


def approx(values):
    """pytest.approx for a list that may hold None (no advantage)."""
    return [v if v is None else pytest.approx(v, rel=1e-6, abs=1e-9) for v in values]


# --- estimators ------------------------------------------------------------

def test_grpo_two_of_four():
    # mean 0.5, population std 0.5: +-0.5 / (0.5 + eps)
    a = 0.5 / 0.500001
    assert grpo([1, 0, 0, 1]).tolist() == approx([a, -a, -a, a])


def test_grpo_one_of_four():
    # mean 0.25, std sqrt(0.25 * 0.75) = sqrt(3)/4: winner 0.75/(sqrt3/4) = sqrt3, losers -1/sqrt3
    a = grpo([1, 0, 0, 0], eps=0.0).tolist()
    assert a == approx([math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3)])


def test_dr_grpo_is_mean_centred_only():
    assert dr_grpo([1, 0, 0, 0]).tolist() == approx([0.75, -0.25, -0.25, -0.25])
    assert dr_grpo([0.2, 0.6]).tolist() == approx([-0.2, 0.2])


def test_rloo_leaves_itself_out():
    # r_i - mean(others): 1 - 0 = 1; 0 - 1/3
    assert rloo([1, 0, 0, 0]).tolist() == approx([1.0, -1 / 3, -1 / 3, -1 / 3])
    # 0.5 - (1+0)/2 = 0; 1 - (0.5+0)/2 = 0.75; 0 - (0.5+1)/2 = -0.75
    assert rloo([0.5, 1.0, 0.0]).tolist() == approx([0.0, 0.75, -0.75])
    assert rloo([1.0]).tolist() == [0.0]


def test_estimators_keep_tensor_dtype_and_sum_to_zero():
    r = torch.tensor([0.3, 0.9, 0.1, 0.5], dtype=torch.float64)
    for name in ESTIMATORS:
        a = get_estimator(name)(r)
        assert a.dtype == torch.float64
        assert float(a.sum()) == pytest.approx(0.0, abs=1e-12)


def test_registry():
    assert set(ESTIMATORS) == {"grpo", "dr_grpo", "rloo"}
    assert get_estimator("grpo", eps=0.5)([1, 0]).tolist() == approx([0.5, -0.5])  # 0.5/(0.5+0.5)
    with pytest.raises(ValueError, match="unknown estimator"):
        get_estimator("ppo")


def test_informative():
    assert informative([1, 0])
    assert not informative([1, 1, 1])
    assert not informative([0.5])
    assert not informative([0.4, 0.4 + 1e-9])


# --- episode rules -----------------------------------------------------------

def ep(reward, group="g", verdict="auto", termination="submitted", flags=(), **kw) -> Trajectory:
    if verdict == "auto":
        verdict = "no_verdict" if reward is None else ("pass" if reward > 0 else "fail")
    return Trajectory(episode_id=f"e{id(kw)}", task_id="t", group_id=group, reward=reward,
                      verdict=verdict, termination=termination, flags=list(flags),
                      token_ids=[1, 2], logprobs=[0.0, -1.0], loss_mask=[0, 1], **kw)


def test_cut_off_episodes_are_masked_not_scored():
    eps = [ep(1.0), ep(0.0), ep(0.0), ep(1.0, termination="timeout"), ep(0.0, termination="error"),
           ep(0.0, termination="context_full")]
    out = compute_advantages(eps, TrainConfig(adv_eps=1e-12))
    # Statistics over [1, 0, 0] only: mean 1/3, std sqrt(2)/3 -> sqrt2 and -1/sqrt2.
    assert out.values[:3] == approx([math.sqrt(2), -1 / math.sqrt(2), -1 / math.sqrt(2)])
    assert out.values[3:] == [None, None, None]
    r = out.report
    assert (r.masked, r.trained, r.groups, r.dropped_groups) == (3, 3, 1, 0)
    assert r.mask_reasons == {"termination:timeout": 1, "termination:error": 1,
                              "termination:context_full": 1}


def test_turn_limit_is_scored_by_default():
    out = compute_advantages([ep(1.0), ep(0.0, termination="turn_limit")],
                             TrainConfig(estimator="dr_grpo"))
    assert out.values == approx([0.5, -0.5])


def test_no_verdict_is_masked():
    eps = [ep(1.0), ep(0.0), ep(None), ep(1.0, verdict="no_verdict"), ep(0.0, verdict=None),
           ep(1.0, token_source="unavailable")]
    out = compute_advantages(eps, TrainConfig(estimator="dr_grpo"))
    assert out.values == approx([0.5, -0.5, None, None, None, None])
    assert out.report.mask_reasons == {"no_verdict": 3, "no_tokens": 1}


def test_equal_groups_are_dropped_and_counted():
    eps = [ep(1.0, "a"), ep(1.0, "a"), ep(0.0, "b"), ep(0.0, "b"), ep(1.0, "c"), ep(0.0, "c"),
           ep(1.0, "d"), ep(None, "d")]  # d: one scorable episode left
    out = compute_advantages(eps, TrainConfig(estimator="dr_grpo"))
    assert out.values == approx([None, None, None, None, 0.5, -0.5, None, None])
    r = out.report
    assert (r.groups, r.dropped_groups, r.dropped_episodes, r.trained, r.masked) == (4, 3, 5, 2, 1)
    assert r.as_metrics()["dropped_groups"] == 3.0


def test_group_falls_back_to_task_and_step():
    a = ep(1.0, group="", step=3)
    b = ep(0.0, group="", step=3)
    c = ep(0.5, group="", step=4)
    out = compute_advantages([a, b, c], TrainConfig(estimator="dr_grpo"))
    assert out.values == approx([0.5, -0.5, None])


def test_worst_flag_action_kind_wins_over_severity():
    spec = RewardSpec(flag_policy={"constant_eq": "mask", "hack": "zero", "suspicious": "penalize"})
    assert spec.worst_action([]) == ("record", None)
    assert spec.worst_action([{"kind": "odd", "severity": "info"}]) == ("record", "odd")
    assert spec.worst_action([{"kind": "x", "severity": "suspicious"}]) == ("penalize", "x")
    assert spec.worst_action([Flag("constant_eq", "d", severity="info")]) == ("mask", "constant_eq")
    assert spec.worst_action([{"kind": "x", "severity": "suspicious"}, {"kind": "y", "severity": "hack"}]) \
        == ("zero", "y")


def _verdict_meta(traj, action, by, masked=False):
    traj.meta.update(flag_action=action, flag_by=by, **({"masked": True} if masked else {}))
    return traj


def test_training_takes_the_verifiers_flag_decision_as_it_is():
    # The verifier already zeroed or penalized the stored reward: training applies nothing again
    # (a penalty is never applied twice) and keeps masked episodes out.
    eps = [
        _verdict_meta(ep(0.0, flags=[{"kind": "protected_path_edit", "severity": "hack"}]), "zero", "protected_path_edit"),
        _verdict_meta(ep(0.5, flags=[{"kind": "slow", "severity": "suspicious"}]), "penalize", "slow"),
        _verdict_meta(ep(1.0, flags=[{"kind": "note", "severity": "info"}]), "record", "note"),
        _verdict_meta(ep(1.0, flags=[{"kind": "git_history", "severity": "hack"}]), "mask", "git_history", True),
        ep(0.0),
    ]
    out = compute_advantages(eps, TrainConfig(estimator="dr_grpo"))
    # Group [0, 0.5, 1, 0], mean 0.375.
    assert out.rewards == approx([0.0, 0.5, 1.0, None, 0.0])
    assert out.values == approx([-0.375, 0.125, 0.625, None, -0.375])
    assert out.report.flag_actions == {"zero": 1, "penalize": 1, "record": 1, "mask": 1}
    assert out.report.mask_reasons == {"flag:git_history": 1}


def test_std_floor_keeps_a_shaping_only_spread_small():
    shaping = [0.1, 0.0, 0.0, 0.0]                   # nothing passes, one answer compiles
    plain = grpo(shaping)
    floored = grpo(shaping, std_floor=0.3)
    assert float(plain.max()) == pytest.approx(math.sqrt(3), rel=1e-4)   # blown up like a real split
    assert float(floored.max()) == pytest.approx(0.075 / 0.3, rel=1e-4)
    real = [1.0, 0.0, 0.0, 0.0]                      # a real pass/fail split (std 0.433) is untouched
    assert torch.allclose(grpo(real, std_floor=0.3), grpo(real))
    eps = [ep(0.1), ep(0.0, verdict="fail"), ep(0.0, verdict="fail"), ep(0.0, verdict="fail")]
    adv = compute_advantages(eps, TrainConfig(adv_std_floor=0.3))
    assert adv.values[0] == pytest.approx(0.25, rel=1e-4)


def test_shuffled_rewards_keep_the_group_statistics_but_not_the_assignment():
    groups = [[ep(float(i == j), group=f"g{j}") for i in range(6)] for j in range(6)]
    eps = [e for g in groups for e in g]
    honest = compute_advantages(eps, TrainConfig())
    control = compute_advantages(eps, TrainConfig(shuffle_rewards=True))
    assert sorted(v for v in honest.values) == pytest.approx(sorted(v for v in control.values))
    assert honest.values != control.values           # some passing answer lost its positive advantage
    assert control.values == compute_advantages(eps, TrainConfig(shuffle_rewards=True)).values  # seeded


# --- sub-step credit ---------------------------------------------------------

def stepped(reward: float, first_met: dict, parts: dict, turns: int = 3) -> Trajectory:
    """An episode of `turns` turns, each one sampled run of two tokens between observations."""
    from tryloop.agent.trajectory import Turn

    mask = [0, 0] + [1, 1, 0] * turns
    return Trajectory(episode_id=f"e{reward}", task_id="t", group_id="g", verdict="pass" if reward >= 1 else "fail", reward=reward,
                      termination="submitted", token_ids=list(range(len(mask))), logprobs=[0.0] * len(mask),
                      loss_mask=mask, turns=[Turn(i, "") for i in range(turns)],
                      meta={"substeps_first_met": first_met, "substep_rewards": parts})


def test_substep_credit_goes_to_the_turns_up_to_the_one_that_met_it():
    from tryloop.train.advantages import turn_rewards

    # rows (0.5) met at turn 0, answer (0.5) at turn 1; turn 2 came after both: it earns only the rest (0.1).
    t = stepped(1.1, {"step:rows": 0, "step:answer": 1}, {"step:rows": 0.5, "step:answer": 0.5})
    assert turn_rewards(t) == pytest.approx([1.1, 0.6, 0.1])
    never = stepped(0.1, {"step:rows": None, "step:answer": None}, {"step:rows": 0.0, "step:answer": 0.0})
    assert turn_rewards(never) == pytest.approx([0.1, 0.1, 0.1])
    # A reward a flag zeroed is not split, nor are turns that do not line up with the sampled runs.
    zeroed = stepped(0.0, {"step:rows": 0}, {"step:rows": 0.5})
    zeroed.meta["flag_action"] = "zero"
    assert turn_rewards(zeroed) is None
    short = stepped(1.1, {"step:rows": 0}, {"step:rows": 1.0})
    short.turns = short.turns[:2]
    assert turn_rewards(short) is None
    assert turn_rewards(Trajectory(episode_id="e", task_id="t", reward=1.0)) is None


def test_substep_credit_moves_each_turn_by_the_estimators_slope():
    good = stepped(1.1, {"step:rows": 0, "step:answer": 1}, {"step:rows": 0.5, "step:answer": 0.5})
    bad = stepped(0.1, {"step:rows": None, "step:answer": None}, {"step:rows": 0.0, "step:answer": 0.0})
    plain = compute_advantages([good, bad], TrainConfig())
    assert plain.for_update() == plain.values                       # off by default: one value per episode
    adv = compute_advantages([good, bad], TrainConfig(substep_credit=True))
    a_good, a_bad = adv.values                                     # grpo: +1, -1 (spread 1.0, std 0.5)
    assert (a_good, a_bad) == (pytest.approx(1.0, rel=1e-5), pytest.approx(-1.0, rel=1e-5))
    slope = (a_good - a_bad) / (1.1 - 0.1)
    assert adv.per_turn[0] == pytest.approx([a_good, a_good + slope * (0.6 - 1.1), a_good + slope * (0.1 - 1.1)])
    assert adv.per_turn[1] == pytest.approx([a_bad] * 3)
    assert adv.for_update() == adv.per_turn
    # The negative control keeps its information-free update: no per-turn credit with shuffled rewards.
    assert compute_advantages([good, bad], TrainConfig(substep_credit=True, shuffle_rewards=True)).per_turn == [None] * 2


def test_substep_credit_on_a_code_task_repro_then_fix():
    from tryloop.train.advantages import turn_rewards

    # A bug-fix task: the repro test (1/4 of the tests component) met at turn 0, the fix (3/4) at turn 2.
    both = stepped(1.1, {"step:repro": 0, "step:fix": 2}, {"step:repro": 0.25, "step:fix": 0.75}, turns=4)
    assert turn_rewards(both) == pytest.approx([1.1, 0.85, 0.85, 0.1])
    # The repro met, the fix never: its part (0) is everyone's; only turn 0 earned the repro's.
    repro_only = stepped(0.35, {"step:repro": 0, "step:fix": None}, {"step:repro": 0.25, "step:fix": 0.0}, turns=4)
    assert turn_rewards(repro_only) == pytest.approx([0.35, 0.1, 0.1, 0.1])
    # The fix without a repro: the fix's part up to its turn, nothing for the repro.
    fix_only = stepped(0.85, {"step:repro": None, "step:fix": 1}, {"step:repro": 0.0, "step:fix": 0.75}, turns=4)
    assert turn_rewards(fix_only) == pytest.approx([0.85, 0.85, 0.1, 0.1])
    adv = compute_advantages([both, repro_only, fix_only], TrainConfig(substep_credit=True))
    assert all(p is not None and p == sorted(p, reverse=True) for p in adv.per_turn)  # earlier turns earn more
    assert adv.per_turn[0][0] > adv.per_turn[2][0] > adv.per_turn[1][0]
