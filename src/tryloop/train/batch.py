"""Trajectories -> padded tensors, aligned for next-token prediction.

A causal LM's logits at position j predict token j+1. So every per-token
training tensor here has T-1 columns, and column j describes TARGET token j+1:

    input_ids      t0  t1  t2  t3  t4          (B, T)
    logits at      0   1   2   3               predict t1..t4
    loss_mask          m1  m2  m3  m4          (B, T-1): column j = loss_mask[j+1]
    old_logprobs       l1  l2  l3  l4          (B, T-1): column j = logprobs[j+1]

Token 0 is never a target (nothing predicts it). Sequences are right-padded;
padding has attention 0 and loss mask 0. A sequence longer than max_length
loses its tail (the head is the context the kept tokens were sampled in, so it
must stay), and its masks are trimmed with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch

from tryloop.agent.trajectory import Trajectory


@dataclass
class Batch:
    input_ids: torch.Tensor             # (B, T) long
    attention_mask: torch.Tensor        # (B, T) long
    loss_mask: torch.Tensor             # (B, T-1) float, 1 where the target token was sampled
    old_logprobs: torch.Tensor          # (B, T-1) float, sampler logprob of the target token
    advantages: torch.Tensor            # (B, T-1) float, the sequence's advantage on its loss tokens
    truncated: int = 0                  # sequences cut to max_length

    @property
    def size(self) -> int:
        return self.input_ids.shape[0]

    @property
    def tokens(self) -> int:
        """Tokens the loss is taken on."""
        return int(self.loss_mask.sum())

    def to(self, device: torch.device | str) -> Batch:
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        for k, v in moved.items():
            if isinstance(v, torch.Tensor):
                moved[k] = v.to(device, non_blocking=True)
        return Batch(**moved)


def turn_spans(loss_mask: Sequence[int]) -> list[tuple[int, int]]:
    """[start, end) of each run of sampled tokens: one per turn the policy spoke in."""
    spans, start = [], None
    for i, m in enumerate(loss_mask):
        if m and start is None:
            start = i
        elif not m and start is not None:
            spans.append((start, i))
            start = None
    if start is not None:
        spans.append((start, len(loss_mask)))
    return spans


def _token_advantages(t: Trajectory, a: float | Sequence[float]) -> torch.Tensor:
    """One advantage per token of `t`: the episode's, or each turn's on that turn's sampled tokens."""
    if isinstance(a, int | float):
        return torch.full((len(t.token_ids),), float(a))
    spans = turn_spans(t.loss_mask)
    if len(spans) != len(a):
        raise ValueError(f"episode {t.episode_id}: {len(a)} turn advantages for {len(spans)} sampled turns")
    out = torch.zeros(len(t.token_ids))
    for (start, end), v in zip(spans, a, strict=True):
        out[start:end] = float(v)
    return out


def collate(trajectories: Sequence[Trajectory], advantages: Sequence[float | Sequence[float]],
            max_length: int | None = None, pad_id: int = 0) -> Batch:
    if not trajectories:
        raise ValueError("cannot collate an empty batch")
    if len(trajectories) != len(advantages):
        raise ValueError(f"{len(trajectories)} trajectories but {len(advantages)} advantages")
    if max_length is not None and max_length < 2:
        raise ValueError("max_length must leave room for at least one target token")
    for t in trajectories:
        n = len(t.token_ids)
        if len(t.logprobs) != n or len(t.loss_mask) != n:
            raise ValueError(f"episode {t.episode_id}: token_ids, logprobs and loss_mask differ in "
                             f"length ({n}, {len(t.logprobs)}, {len(t.loss_mask)})")
        if n < 2:
            raise ValueError(f"episode {t.episode_id}: fewer than two tokens, nothing to predict")

    lengths = [len(t.token_ids) if max_length is None else min(len(t.token_ids), max_length)
               for t in trajectories]
    b, width = len(trajectories), max(lengths)
    input_ids = torch.full((b, width), pad_id, dtype=torch.long)
    attention = torch.zeros((b, width), dtype=torch.long)
    loss_mask = torch.zeros((b, width - 1), dtype=torch.float32)
    old_lp = torch.zeros((b, width - 1), dtype=torch.float32)
    adv = torch.zeros((b, width - 1), dtype=torch.float32)
    for i, (t, n, a) in enumerate(zip(trajectories, lengths, advantages, strict=True)):
        input_ids[i, :n] = torch.tensor(t.token_ids[:n], dtype=torch.long)
        attention[i, :n] = 1
        # The shift: target j is token j+1.
        loss_mask[i, : n - 1] = torch.tensor(t.loss_mask[1:n], dtype=torch.float32)
        old_lp[i, : n - 1] = torch.tensor(t.logprobs[1:n], dtype=torch.float32)
        adv[i, : n - 1] = _token_advantages(t, a)[1:n]
    adv *= loss_mask
    old_lp *= loss_mask  # a logprob off the mask means nothing; keep it out of any sum
    truncated = sum(len(t.token_ids) > n for t, n in zip(trajectories, lengths, strict=True))
    return Batch(input_ids=input_ids, attention_mask=attention, loss_mask=loss_mask,
                 old_logprobs=old_lp, advantages=adv, truncated=truncated)
