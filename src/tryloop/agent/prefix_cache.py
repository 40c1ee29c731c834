"""Keys/values of recently seen token sequences, for prefilling only what is new in a prompt.

An agent's next prompt is its last prompt + what it sampled + the tool
results, and the episodes of a group share their first prompt: the engine
looks up the longest cached prefix of each new prompt and runs only the rest
through the model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(eq=False)
class CachedPrefix:
    tokens: list[int]
    kv: list[tuple[torch.Tensor, torch.Tensor]]   # per layer: [1, kv_heads, len(tokens), head_dim]
    nbytes: int


class PrefixCache:
    """Keys/values of token sequences seen recently, found by longest common prefix.

    Used only by the worker thread. Holds at most `budget_bytes` and, when given,
    `max_entries` sequences; the least recently used entries go first, and an entry
    that is a prefix of a new one is replaced by it (the new one serves every lookup
    the old one could).
    """

    MIN_HIT = 16                              # shorter matches are not worth a lookup's copies

    def __init__(self, budget_bytes: int, max_entries: int | None = None) -> None:
        if max_entries is not None and max_entries < 1:
            raise ValueError("max_entries must be >= 1 (or None: no limit)")
        self.budget_bytes = budget_bytes
        self.max_entries = max_entries
        self._entries: list[CachedPrefix] = []     # least recently used first
        self.nbytes = 0

    @property
    def enabled(self) -> bool:
        return self.budget_bytes > 0

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, tokens: list[int], *, limit: int) -> tuple[CachedPrefix | None, int]:
        """The entry sharing the longest prefix with `tokens` (at most `limit` tokens of it)."""
        best, best_len = None, 0
        for entry in self._entries:
            n = min(_common_prefix(entry.tokens, tokens), limit)
            if n > best_len:
                best, best_len = entry, n
        if best is None or best_len < self.MIN_HIT:
            return None, 0
        self._entries.remove(best)
        self._entries.append(best)
        return best, best_len

    def add(self, tokens: list[int], kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        nbytes = sum(k.nbytes + v.nbytes for k, v in kv)
        if len(tokens) < self.MIN_HIT or nbytes > self.budget_bytes:
            return
        for old in [e for e in self._entries
                    if len(e.tokens) <= len(tokens) and _common_prefix(e.tokens, tokens) == len(e.tokens)]:
            self._remove(old)
        self._entries.append(CachedPrefix(list(tokens), kv, nbytes))
        self.nbytes += nbytes
        while self.nbytes > self.budget_bytes or (self.max_entries is not None
                                                   and len(self._entries) > self.max_entries):
            self._remove(self._entries[0])

    def clear(self) -> None:
        self._entries.clear()
        self.nbytes = 0

    def _remove(self, entry: CachedPrefix) -> None:
        self._entries.remove(entry)
        self.nbytes -= entry.nbytes


def _common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix, by binary search over slice comparisons (C speed)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n - 1                         # a[:lo] == b[:lo], a[:hi + 1] != b[:hi + 1]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo
