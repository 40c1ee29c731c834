"""Drawing tokens from a model's logits, with the log-probabilities a trainer needs.

`sample_batch` draws one token per row of a [batch, vocab] logits tensor (each
row with its own `SamplingParams` and its own seeded generator); `sample_token`
is the same for one row. Each token comes with two log-probabilities:

- the sampling one: under the distribution actually drawn from, softmax(logits /
  temperature) restricted to the top-p nucleus and renormalized (0.0 for greedy,
  a point mass);
- the policy one: log softmax(logits) at temperature 1 over the whole vocabulary,
  what a trainer recomputes from the same weights.

How a row draws. The vocabulary-wide work (log_softmax, temperature, nucleus,
exp, the totals of 1,024-token blocks) is done for all rows at once; the only
per-row work is one uniform number u from the row's own generator, and the token
is the inverse of the row's cumulative distribution at u, found in two batched
levels: the block, from a cumulative sum over the block totals, then the token,
from one over that block alone. So a row's token depends only on its logits, its
parameters and its generator — never on which other rows share the batch — and a
seeded request is reproducible. (`torch.multinomial` per row would instead draw
one exponential per vocabulary entry for every row.)

The cumulative sums are in float64 (over block totals, then within the block
drawn: `_inverse_cdf`) and u has 53 bits, so every token with probability above
~1e-15 is drawn with its own probability, and a token outside the nucleus
(probability exactly 0) can never be drawn.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int
    temperature: float = 1.0              # 0 = greedy
    top_p: float = 1.0
    stop_token_ids: frozenset[int] = frozenset()
    stop_strings: tuple[str, ...] = ()
    seed: int = 0

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


def sample_token(logits: torch.Tensor, params: SamplingParams,
                 generator: torch.Generator) -> tuple[int, float, float]:
    """Draw one token from float32 `logits` [vocab]: (token, sampling logprob, policy logprob)."""
    return sample_batch(logits[None, :], [params], [generator])[0]


def sample_batch(logits: torch.Tensor, params: Sequence[SamplingParams],
                 generators: Sequence[torch.Generator]) -> list[tuple[int, float, float]]:
    """Draw one token per row of float32 `logits` [batch, vocab], row i with `params[i]` and
    `generators[i]`: [(token, sampling logprob, policy logprob)] in row order."""
    n = logits.shape[0]
    if not (n == len(params) == len(generators)):
        raise ValueError(f"{n} rows of logits, {len(params)} params, {len(generators)} generators")
    device = logits.device
    policy = torch.log_softmax(logits, dim=-1)
    tokens = torch.empty(n, dtype=torch.long, device=device)
    sample_lp = torch.zeros(n, dtype=policy.dtype, device=device)

    greedy = [i for i, p in enumerate(params) if p.temperature == 0]
    drawn = [i for i, p in enumerate(params) if p.temperature != 0]
    if greedy:
        g = torch.tensor(greedy, device=device) if len(greedy) < n else None
        tokens[g if g is not None else slice(None)] = torch.argmax(
            logits if g is None else logits[g], dim=-1)
    if drawn:
        d = torch.tensor(drawn, device=device) if len(drawn) < n else None
        rows = [params[i] for i in drawn]
        # Each row's path depends only on its own parameters, so its numbers do not depend on
        # its neighbours: T=1 rows read the policy as is, only top_p < 1 rows are renormalized.
        logp = policy if d is None else policy[d]
        hot = [j for j, p in enumerate(rows) if p.temperature != 1]
        if hot:
            logp = logp.clone() if logp is policy else logp
            temps = torch.tensor([rows[j].temperature for j in hot], dtype=logits.dtype, device=device)
            src = torch.tensor([drawn[j] for j in hot], device=device)
            logp[torch.tensor(hot, device=device)] = torch.log_softmax(logits[src] / temps[:, None], dim=-1)
        nucleus = [j for j, p in enumerate(rows) if p.top_p < 1]
        if nucleus:
            logp = logp.clone() if logp is policy else logp
            top_p = torch.tensor([rows[j].top_p for j in nucleus], dtype=logp.dtype, device=device)
            at = torch.tensor(nucleus, device=device)
            logp[at] = _nucleus(logp[at], top_p)
        u = torch.cat([torch.rand(1, dtype=torch.float64, generator=generators[i], device=device)
                       for i in drawn])[:, None]
        picked = _inverse_cdf(logp.exp(), u)
        if d is None:
            tokens = picked[:, 0]
            sample_lp = logp.gather(1, picked)[:, 0]
        else:
            tokens[d] = picked[:, 0]
            sample_lp[d] = logp.gather(1, picked)[:, 0]
    policy_lp = policy.gather(1, tokens[:, None])[:, 0]
    return list(zip(tokens.tolist(), sample_lp.tolist(), policy_lp.tolist(), strict=True))


#: Tokens per block of the two-level inverse CDF: the vocabulary-wide pass is one block sum, the
#: cumulative sums run over the block totals and over one block per row.
CDF_BLOCK = 1024


def _inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Per row, the token where the cumulative distribution of `probs` [rows, vocab] (float32, not
    necessarily normalized) first exceeds `u` [rows, 1] (float64 in [0, 1)) times the row's total:
    [rows, 1] indices.

    In two levels, all sums in float64: block totals, the block where u falls, then the token
    within that block. A full-vocabulary float64 cumulative sum costs a converted copy and a
    sequential scan of every row; this reads the vocabulary once, in a vectorized reduction (16
    rows of 49k tokens: 2.6 ms against 12.8 ms, benchmarks/README.md). Each level searches
    strictly below its total, so where the row's total is positive the token drawn has positive
    probability; the index is always within the vocabulary."""
    rows, vocab = probs.shape
    full = vocab // CDF_BLOCK * CDF_BLOCK
    sums = [probs[:, :full].view(rows, -1, CDF_BLOCK).sum(-1, dtype=torch.float64)] if full else []
    if full < vocab:
        sums.append(probs[:, full:].sum(-1, keepdim=True, dtype=torch.float64))
    block_cdf = torch.cumsum(torch.cat(sums, dim=1), dim=-1)
    x = u * block_cdf[:, -1:]
    block = _search_below_total(block_cdf, x)
    before = torch.where(block > 0, block_cdf.gather(1, (block - 1).clamp_(min=0)), 0.0)
    cols = block * CDF_BLOCK + torch.arange(CDF_BLOCK, device=probs.device)
    inside = cols < vocab
    local = torch.where(inside, probs.gather(1, cols.clamp(max=vocab - 1)), 0.0)
    offset = _search_below_total(torch.cumsum(local, dim=-1, dtype=torch.float64), x - before)
    # A row without positive mass (NaN or all-zero probabilities: a diverged model) finds the
    # last column of the last block, which may be past the vocabulary.
    return (block * CDF_BLOCK + offset).clamp_(max=vocab - 1)


def _search_below_total(cdf: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The first column of the non-decreasing `cdf` [rows, n] above `x` [rows, 1], `x` first
    brought strictly below the row's total so that the column found adds positive mass."""
    total = cdf[:, -1:]
    x = torch.minimum(x.clamp(min=0.0), torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, x, right=True).clamp_(max=cdf.shape[-1] - 1)


def _nucleus(logp: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Per row, keep the smallest set of most likely tokens whose mass reaches top_p; renormalize.

    `logp` [rows, vocab], `top_p` [rows]."""
    sorted_logp, order = torch.sort(logp, dim=-1, descending=True, stable=True)
    p_sorted = sorted_logp.exp()
    mass_before = torch.cumsum(p_sorted, dim=-1) - p_sorted
    drop_sorted = mass_before >= top_p[:, None]
    drop = torch.zeros_like(drop_sorted).scatter_(1, order, drop_sorted)   # the top token is always kept
    kept = logp.masked_fill(drop, float("-inf"))
    return kept - torch.logsumexp(kept, dim=-1, keepdim=True)
