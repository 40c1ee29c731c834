"""Drawing one token from a model's logits, with the log-probabilities a trainer needs.

`sample_token` returns two log-probabilities for the token it draws:

- the sampling one: under the distribution actually drawn from, softmax(logits /
  temperature) restricted to the top-p nucleus and renormalized (0.0 for greedy,
  a point mass);
- the policy one: log softmax(logits) at temperature 1 over the whole vocabulary,
  what a trainer recomputes from the same weights.
"""

from __future__ import annotations

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
    policy = torch.log_softmax(logits, dim=-1)
    if params.temperature == 0:
        token = int(torch.argmax(logits))
        return token, 0.0, float(policy[token])
    logp = policy if params.temperature == 1 else torch.log_softmax(logits / params.temperature, -1)
    if params.top_p < 1:
        logp = _nucleus(logp, params.top_p)
    token = int(torch.multinomial(logp.exp(), 1, generator=generator))
    return token, float(logp[token]), float(policy[token])


def _nucleus(logp: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches top_p; renormalize."""
    sorted_logp, order = torch.sort(logp, descending=True)
    mass_before = torch.cumsum(sorted_logp.exp(), dim=-1) - sorted_logp.exp()
    drop = order[mass_before >= top_p]            # the most likely token is always kept
    kept = logp.clone()
    kept[drop] = float("-inf")
    return kept - torch.logsumexp(kept, dim=-1)
