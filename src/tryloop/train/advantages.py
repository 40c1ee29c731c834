"""Group advantages, and the rules that decide which episodes count at all.

A group is the episodes of one task in one step. An estimator turns the
rewards of one group into one advantage per episode. Before that, each episode
is judged:

- masked: it ended cut off (time-out, error, full context), has no verdict, or
  has no token-exact record. It is left out of the group statistics AND the
  loss: a missing answer is not a wrong answer (docs/architecture.md, invariant 4).
- flagged: each reward-hack flag maps, by kind or else by severity, to an
  action; the most severe action of an episode wins:
  record < penalize (reward - penalty) < zero (reward = 0) < mask.
- dropped group: all remaining rewards equal (or fewer than two episodes). Every
  advantage would be 0, so the group costs compute and carries no signal
  (DAPO dynamic sampling); the run loop may sample more groups to refill.
"""

from __future__ import annotations

import functools
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from tryloop.agent.trajectory import Trajectory
from tryloop.train.batch import turn_spans
from tryloop.train.config import TrainConfig

Rewards = Sequence[float] | torch.Tensor
Estimator = Callable[[Rewards], torch.Tensor]

# Rewards closer than this count as equal: a 1e-9 spread would otherwise be
# blown up to +-1 by the std division of GRPO.
EQUAL_TOL = 1e-6


def _rewards(r: Rewards) -> torch.Tensor:
    t = torch.as_tensor(r)
    return t if t.is_floating_point() else t.to(torch.float32)


def grpo(rewards: Rewards, eps: float = 1e-6, std_floor: float = 0.0) -> torch.Tensor:
    """(r - mean) / (max(std, std_floor) + eps). Population std: the group is all we have, not a
    sample of it. The floor keeps a spread made only of small shaping terms small."""
    r = _rewards(rewards)
    return (r - r.mean()) / (r.std(unbiased=False).clamp(min=std_floor) + eps)


def dr_grpo(rewards: Rewards) -> torch.Tensor:
    """r - mean. Dr. GRPO: dividing by the std favours groups that are nearly all right or all wrong."""
    r = _rewards(rewards)
    return r - r.mean()


def rloo(rewards: Rewards) -> torch.Tensor:
    """r_i - mean of the others = n/(n-1) * (r_i - mean): a baseline that does not contain r_i."""
    r = _rewards(rewards)
    n = r.numel()
    if n < 2:
        return torch.zeros_like(r)
    return (r - r.mean()) * (n / (n - 1))


ESTIMATORS: dict[str, Callable[..., torch.Tensor]] = {"grpo": grpo, "dr_grpo": dr_grpo, "rloo": rloo}


def get_estimator(name: str, eps: float = 1e-6, std_floor: float = 0.0) -> Estimator:
    try:
        fn = ESTIMATORS[name]
    except KeyError:
        raise ValueError(f"unknown estimator {name!r}; known: {sorted(ESTIMATORS)}") from None
    return functools.partial(fn, eps=eps, std_floor=std_floor) if fn is grpo else fn


def informative(rewards: Sequence[float]) -> bool:
    """True when a group can teach anything: at least two rewards, not all equal."""
    return len(rewards) >= 2 and max(rewards) - min(rewards) > EQUAL_TOL


# --- which episodes count -------------------------------------------------

def flag_action(traj: Trajectory) -> tuple[str, str | None]:
    """What the verifier's flag policy (the only one: `rewards.spec.flag_policy`) did to this
    episode, and the flag kind that decided it. The reward is already zeroed or penalized; a
    masked episode is kept out of training here."""
    if not traj.flags:
        return "record", None
    if traj.meta.get("masked"):
        return "mask", traj.meta.get("flag_by") or "mask"
    return str(traj.meta.get("flag_action", "record")), traj.meta.get("flag_by")


def mask_reason(traj: Trajectory, mask_terminations: frozenset[str]) -> str | None:
    """Why this episode must not be scored, or None when it may."""
    if traj.termination in mask_terminations:
        return f"termination:{traj.termination}"
    if traj.verdict not in ("pass", "fail") or traj.reward is None:
        return "no_verdict"
    if traj.token_source == "unavailable":
        return "no_tokens"
    return None


def group_key(traj: Trajectory) -> str:
    return traj.group_id or f"{traj.task_id}@{traj.step}"


@dataclass
class AdvantageReport:
    episodes: int = 0
    trained: int = 0                    # episodes with an advantage
    masked: int = 0
    groups: int = 0
    dropped_groups: int = 0             # all rewards equal: no signal
    dropped_episodes: int = 0           # unmasked episodes of dropped groups
    dropped_keys: list[str] = field(default_factory=list)
    mask_reasons: Counter[str] = field(default_factory=Counter)
    flag_actions: Counter[str] = field(default_factory=Counter)  # action -> episodes

    def as_metrics(self) -> dict[str, float]:
        out = {k: float(getattr(self, k)) for k in
               ("episodes", "trained", "masked", "groups", "dropped_groups", "dropped_episodes")}
        out.update({f"mask/{k}": float(v) for k, v in self.mask_reasons.items()})
        out.update({f"flag/{k}": float(v) for k, v in self.flag_actions.items()})
        return out


@dataclass
class Advantages:
    """One entry per input trajectory, in order; advantage None = not trained on."""

    values: list[float | None]
    rewards: list[float | None]         # the rewards the group statistics saw (after flags)
    report: AdvantageReport
    per_turn: list[list[float] | None] = field(default_factory=list)   # substep_credit: one per turn

    def for_update(self) -> list[float | list[float] | None]:
        """What the learner trains on: the per-turn advantages where there are some, else the episode's."""
        turns = self.per_turn or [None] * len(self.values)
        return [t if t is not None and v is not None else v for v, t in zip(self.values, turns, strict=True)]


# --- sub-step credit --------------------------------------------------------

def turn_rewards(traj: Trajectory) -> list[float] | None:
    """The reward each turn is credited with: every sub-step's part to the turns up to the one that
    first met it (to all turns if it was never met), the rest of the reward to every turn. None when
    the episode cannot be split: no tracked sub-steps, a reward a flag changed, or turns that do not
    line up with the sampled token runs."""
    first = traj.meta.get("substeps_first_met")
    parts = traj.meta.get("substep_rewards")
    if not first or not parts or traj.reward is None or traj.meta.get("flag_action") in ("zero", "penalize"):
        return None
    n = len(traj.turns)
    if n < 2 or len(turn_spans(traj.loss_mask)) != n:
        return None
    rest = float(traj.reward) - sum(parts.values())
    return [rest + sum(v for k, v in parts.items() if first.get(k) is None or t <= first[k]) for t in range(n)]


def compute_advantages(trajectories: Sequence[Trajectory],
                       config: TrainConfig | None = None) -> Advantages:
    cfg = config or TrainConfig()
    estimator = get_estimator(cfg.estimator, cfg.adv_eps, cfg.adv_std_floor)
    n = len(trajectories)
    report = AdvantageReport(episodes=n)
    rewards: list[float | None] = [None] * n
    values: list[float | None] = [None] * n

    groups: dict[str, list[int]] = {}
    for i, t in enumerate(trajectories):
        reason = mask_reason(t, cfg.mask_terminations)
        action, by = flag_action(t)
        if t.flags:
            report.flag_actions[action] += 1
        if reason is None and action == "mask":
            reason = f"flag:{by}"
        if reason is not None:
            report.masked += 1
            report.mask_reasons[reason] += 1
            continue
        rewards[i] = float(t.reward)  # type: ignore[arg-type]  # mask_reason checked it
        groups.setdefault(group_key(t), []).append(i)

    report.groups = len(groups)
    per_turn: list[list[float] | None] = [None] * n
    for key, idx in groups.items():
        group_rewards = [rewards[i] for i in idx]
        if cfg.shuffle_rewards:  # seeded by the group, so a resumed run shuffles the same way
            random.Random(key).shuffle(group_rewards)
        if not informative(group_rewards):  # type: ignore[arg-type]
            report.dropped_groups += 1
            report.dropped_episodes += len(idx)
            report.dropped_keys.append(key)
            continue
        adv = estimator(torch.tensor(group_rewards, dtype=torch.float64))
        for i, a in zip(idx, adv.tolist(), strict=True):
            values[i] = a
        report.trained += len(idx)
        if cfg.substep_credit and not cfg.shuffle_rewards:
            # Every estimator is affine in an episode's reward within its group, so a turn's advantage is
            # the episode's moved by the estimator's slope times how far the turn's reward is from it.
            r = torch.tensor(group_rewards, dtype=torch.float64)
            slope = float((adv.max() - adv.min()) / (r.max() - r.min()))
            for i in idx:
                tr = turn_rewards(trajectories[i])
                if tr is not None:
                    per_turn[i] = [values[i] + slope * (x - rewards[i]) for x in tr]  # type: ignore[operator]
    return Advantages(values=values, rewards=rewards, report=report, per_turn=per_turn)

