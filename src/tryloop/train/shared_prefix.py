"""The prompt a micro-batch shares, run once.

Every sequence of a training run starts with the same chat-templated system prompt (tools,
answer conventions), and the sequences of one group share their whole prompt. With a group in
one micro-batch, the default run's decoder then runs about half of the token positions it would
run row by row (a function task's prompt is ~130 tokens, its answer up to 192), and multi-turn
episodes, whose later turns carry the earlier ones, share more.

Exact, not an approximation: the prefix's hidden states and its keys/values are computed once
(batch 1) and every row attends to them, so each row sees the same values it would in a full
pass, and the gradient of every row flows back through the one prefix computation (autograd
sums the rows' contributions where the prefix's keys/values are expanded to the batch).

Two KV caches carry the prefix from one pass to the other, both safe under activation
checkpointing, which runs a layer's forward a second time in the backward pass:

- `_Recorder` (the prefix pass) keeps the states a layer hands it, replacing, not appending, so
  the replay stores the same thing again;
- `_Reader` (the rest of the rows) returns the prefix's states followed by the new ones and
  stores nothing, so the replay reads what the first forward read.

A layer drops its cache under checkpointing unless it is marked as able to keep it
(`_can_checkpoint_with_cache`, which transformers sets only for layers that never write); the
learner marks its own model's layers, which these two caches make safe. Models whose layers are
not all full-attention caches (sliding windows), or a transformers without that mark, take the
plain path.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers.cache_utils import Cache, DynamicLayer

from tryloop.agent.engine import cache_kwarg, full_attention_cache

MIN_PREFIX = 16   # shorter shared prefixes are not worth a second decoder call


def supported(decoder: nn.Module, checkpointing: bool) -> bool:
    """Whether `decoder` (the model's `get_decoder()`) can run a shared prefix: full-attention
    layers only, and, with activation checkpointing, a transformers whose checkpointed layers can
    be told to keep their cache."""
    layers = getattr(decoder, "layers", None)
    if layers is None or not full_attention_cache(decoder.config):
        return False
    return not checkpointing or all(hasattr(type(x), "_can_checkpoint_with_cache") for x in layers)


def keep_cache_under_checkpointing(decoder: nn.Module) -> None:
    """Mark this model's decoder layers (the instances, not their class) as keeping the cache
    they are given when checkpointed: only `_Recorder` and `_Reader` are ever given one in a
    pass with gradients, and both give the replay what the first forward saw."""
    for layer in decoder.layers:
        layer._can_checkpoint_with_cache = True


def prefix_length(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> int:
    """Leading positions where every row holds the same real token, leaving each row at least
    one position of its own (the last prefix position's hidden state is still needed: it
    predicts the row's first own token). 0 when shorter than `MIN_PREFIX` or a single row."""
    if input_ids.shape[0] < 2:
        return 0
    same = (input_ids == input_ids[:1]).all(0) & (attention_mask > 0).all(0)
    differs = (~same).nonzero()
    n = int(differs[0]) if differs.numel() else input_ids.shape[1]
    n = min(n, int(attention_mask.sum(1).min()) - 1)
    return n if n >= MIN_PREFIX else 0


def hidden_states(decoder: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                  prefix: int) -> torch.Tensor:
    """The decoder's last hidden states (B, T, H) for the whole batch, its first `prefix`
    positions (the same in every row) run once."""
    kw = cache_kwarg(decoder)
    n_layers = decoder.config.num_hidden_layers
    b = input_ids.shape[0]

    class _Recorder(DynamicLayer):
        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
                   **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
            self.keys, self.values, self.is_initialized = key_states, value_states, True
            return key_states, value_states

        def get_seq_length(self) -> int:
            return 0   # asked before the pass only: the prefix starts at position 0

    class _Reader(DynamicLayer):
        def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
            super().__init__()
            self.keys, self.values, self.is_initialized = keys, values, True
            self.device = keys.device

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
                   **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
            return torch.cat([self.keys, key_states], -2), torch.cat([self.values, value_states], -2)

    # One embedding lookup for both passes: its backward makes a dense vocabulary-sized gradient
    # each time it runs (~0.1 s for SmolLM2 on a CPU).
    ids = torch.cat([input_ids[0, :prefix], input_ids[:, prefix:].reshape(-1)])
    embeds = decoder.get_input_embeddings()(ids)
    recorded = Cache(layers=[_Recorder() for _ in range(n_layers)])
    head = decoder(inputs_embeds=embeds[None, :prefix], attention_mask=attention_mask[:1, :prefix],
                   use_cache=False, **{kw: recorded}).last_hidden_state
    shared = Cache(layers=[_Reader(x.keys.expand(b, -1, -1, -1), x.values.expand(b, -1, -1, -1))
                               for x in recorded.layers])
    tail = decoder(inputs_embeds=embeds[prefix:].view(b, -1, embeds.shape[-1]), attention_mask=attention_mask,
                   use_cache=False, **{kw: shared}).last_hidden_state
    return torch.cat([head.expand(b, -1, -1), tail], 1)
