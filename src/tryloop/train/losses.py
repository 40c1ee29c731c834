"""One clipped-surrogate policy loss, with the knobs of its published variants.

Per token t of sequence i (only where mask == 1, the tokens the policy sampled):

    r    = exp(logp_new - logp_old)
    loss = -min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A)  [+ kl_coef * k3(ref, new)]

- PPO/GRPO: eps_low == eps_high. DAPO clip-higher: eps_high > eps_low, so a
  rare token with positive advantage may grow further before it is clipped.
- GSPO: r is replaced by one ratio per sequence, the geometric mean of its
  token ratios exp(mean_t(logp_new - logp_old)), clipped per sequence; every
  token of the sequence carries the sequence's loss.
- k3 KL (Schulman's estimator, always >= 0): exp(ref - new) - (ref - new) - 1.
- Truncated importance sampling (`is_weights`): when the tokens were sampled by
  other weights (mu, an older version than pi_old: overlapped rollouts) each
  token's loss is multiplied by w = min(exp(logp_old - logp_mu), C), detached
  (`tis_weights`). The clipped ratio then keeps pi_new near pi_old, and w
  corrects for pi_old not being the policy that sampled.

Aggregation (the loss is one number per optimizer step):
- token_mean:    sum over all tokens / number of tokens (DAPO: long answers
                 weigh per token, not per sequence)
- seq_mean:      mean over each sequence's tokens, then over sequences (GRPO)
- seq_sum_const: sum over each sequence's tokens / a constant, then mean over
                 sequences (Dr. GRPO: no length bias from a per-sequence mean)

The denominator of each is `normaliser(...)`. Pass it explicitly when a batch
is split into micro-batches, so that their gradients add up to the gradient of
the whole batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tryloop.train.config import Aggregation

# exp() of a log ratio past this overflows float32 into inf, and inf * 0 = nan
# on masked tokens; such a token is clipped (or diverging) either way.
MAX_LOG_RATIO = 20.0


@dataclass
class LossOutput:
    loss: torch.Tensor                  # scalar, with grad
    stats: dict[str, float]             # token (GSPO: sequence) means over this batch


def normaliser(mask: torch.Tensor | Sequence[torch.Tensor], aggregation: Aggregation,
               loss_const: float | None = None) -> float:
    """The denominator of the aggregated loss: for one mask (B, T), or for the micro-batches of one
    optimizer step together (their widths may differ)."""
    masks = [mask] if isinstance(mask, torch.Tensor) else list(mask)
    if aggregation == "token_mean":
        z = sum(float(m.sum()) for m in masks)
    else:
        z = sum(float((m.sum(-1) > 0).sum()) for m in masks)  # sequences with a policy token
        if aggregation == "seq_sum_const":
            if loss_const is None:
                raise ValueError("aggregation 'seq_sum_const' needs loss_const")
            z *= loss_const
    return max(z, 1.0)


def k3(logp_ref: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """Per-token estimate of KL(pi || ref) from tokens sampled from pi; unbiased, >= 0."""
    d = logp_ref - logp
    return torch.exp(d) - d - 1.0


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last dimension."""
    logits = logits.float()
    lse = torch.logsumexp(logits, dim=-1)
    return lse - (torch.softmax(logits, dim=-1) * logits).sum(-1)


def tis_weights(old_logp: torch.Tensor, behavior_logp: torch.Tensor, mask: torch.Tensor,
                cap: float) -> torch.Tensor:
    """Per-token truncated importance weights min(exp(old - behavior), cap) where mask is set (1
    elsewhere), without gradient."""
    with torch.no_grad():
        m = mask.to(old_logp.dtype)
        log_w = ((old_logp - behavior_logp.to(old_logp.dtype)) * m).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
        return torch.exp(log_w).clamp(max=cap)


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    aggregation: Aggregation = "token_mean",
    loss_const: float | None = None,
    gspo: bool = False,
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    logits: torch.Tensor | None = None,
    norm: float | None = None,
    is_weights: torch.Tensor | None = None,
    is_cap: float | None = None,
) -> LossOutput:
    """Shapes: logp, old_logp, mask (B, T); advantages (B, T) or (B,); logits (B, T, V).

    `norm` overrides the aggregation's denominator (see `normaliser`). `is_weights` (B, T): per-token
    importance weights multiplying each token's loss (`tis_weights`; `is_cap` their truncation, for
    the statistics).
    """
    m = mask.to(logp.dtype)
    adv = advantages.to(logp.dtype)
    if adv.dim() == 1:
        adv = adv[:, None].expand_as(logp)
    log_ratio = ((logp - old_logp.to(logp.dtype)) * m).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    lengths = m.sum(-1)
    lo, hi = 1.0 - eps_low, 1.0 + eps_high

    if gspo:
        seq_log_ratio = log_ratio.sum(-1) / lengths.clamp(min=1)
        seq_adv = (adv * m).sum(-1) / lengths.clamp(min=1)
        ratio = torch.exp(seq_log_ratio)
        seq_loss = -torch.minimum(ratio * seq_adv, ratio.clamp(lo, hi) * seq_adv)
        per_token = seq_loss[:, None].expand_as(logp)
        unit_mask = lengths > 0  # statistics count sequences
        unit_adv = seq_adv
    else:
        ratio = torch.exp(log_ratio)
        per_token = -torch.minimum(ratio * adv, ratio.clamp(lo, hi) * adv)
        unit_mask = m > 0
        unit_adv = adv

    if is_weights is not None:
        per_token = per_token * is_weights.to(logp.dtype).detach()

    kl = None
    if ref_logp is not None:
        kl = k3(ref_logp.to(logp.dtype), logp) * m
        if kl_coef:
            per_token = per_token + kl_coef * kl

    z = norm if norm is not None else normaliser(m, aggregation, loss_const)
    if aggregation == "seq_mean":
        loss = ((per_token * m).sum(-1) / lengths.clamp(min=1)).sum() / z
    else:
        loss = (per_token * m).sum() / z

    with torch.no_grad():
        stats = _stats(ratio, unit_adv, unit_mask, lo, hi, log_ratio, m)
        if kl is not None:
            stats["kl"] = float(kl.sum() / m.sum().clamp(min=1))
        if is_weights is not None:
            tokens = m.sum().clamp(min=1)
            stats["tis_weight_mean"] = float((is_weights * m).sum() / tokens)
            if is_cap is not None:
                stats["tis_truncated_frac"] = float(((is_weights >= is_cap) & (m > 0)).sum() / tokens)
        if logits is not None:
            stats["entropy"] = float((entropy(logits) * m).sum() / m.sum().clamp(min=1))
    return LossOutput(loss=loss, stats=stats)


def _stats(ratio: torch.Tensor, adv: torch.Tensor, unit_mask: torch.Tensor, lo: float, hi: float,
           log_ratio: torch.Tensor, m: torch.Tensor) -> dict[str, float]:
    n = unit_mask.sum().clamp(min=1)
    # Clipped = the clipped branch is the one taken and it has no gradient.
    high = (ratio > hi) & (adv > 0) & unit_mask
    low = (ratio < lo) & (adv < 0) & unit_mask
    tokens = m.sum().clamp(min=1)
    # k3 estimate of KL(old || new) on tokens sampled from old.
    approx_kl = (torch.exp(log_ratio) - 1.0 - log_ratio) * m
    return {
        "clip_frac": float((high | low).sum() / n),
        "clip_frac_high": float(high.sum() / n),
        "clip_frac_low": float(low.sum() / n),
        "ratio_mean": float((ratio * unit_mask).sum() / n),
        "approx_kl": float(approx_kl.sum() / tokens),
        "tokens": float(m.sum()),
    }
