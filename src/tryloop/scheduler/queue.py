"""The two queues of the dispatcher: ready episodes by priority, and retries waiting out their backoff.

Both are binary heaps keyed by episode id with lazy deletion: changing a
priority pushes a new entry and leaves the old one to be skipped, so
re-prioritisation is O(log n) and needs no search.
"""

from __future__ import annotations

import heapq
import itertools


class PriorityQueue:
    """Episode ids by priority (higher first), then by `order` (lower first: submission order)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int, str]] = []
        self._live: dict[str, int] = {}          # id -> sequence number of its current entry
        self._seq = itertools.count()

    def push(self, episode_id: str, priority: float, order: int = 0) -> None:
        seq = next(self._seq)
        self._live[episode_id] = seq
        heapq.heappush(self._heap, (-priority, order, seq, episode_id))

    def reprioritise(self, episode_id: str, priority: float, order: int = 0) -> bool:
        """Move a queued id to a new priority; False when it is not queued here."""
        if episode_id not in self._live:
            return False
        self.push(episode_id, priority, order)
        return True

    def remove(self, episode_id: str) -> bool:
        return self._live.pop(episode_id, None) is not None

    def pop(self) -> str | None:
        while self._heap:
            _, _, seq, episode_id = heapq.heappop(self._heap)
            if self._live.get(episode_id) == seq:
                del self._live[episode_id]
                return episode_id
        return None

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, episode_id: object) -> bool:
        return episode_id in self._live


class DelayQueue:
    """Episode ids that become ready at a time (retry backoff)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, str]] = []
        self._live: dict[str, int] = {}
        self._seq = itertools.count()

    def push(self, episode_id: str, ready_at: float) -> None:
        seq = next(self._seq)
        self._live[episode_id] = seq
        heapq.heappush(self._heap, (ready_at, seq, episode_id))

    def remove(self, episode_id: str) -> bool:
        return self._live.pop(episode_id, None) is not None

    def pop_due(self, now: float) -> list[str]:
        due = []
        while self._heap and self._heap[0][0] <= now:
            _, seq, episode_id = heapq.heappop(self._heap)
            if self._live.get(episode_id) == seq:
                del self._live[episode_id]
                due.append(episode_id)
        return due

    def next_at(self) -> float | None:
        while self._heap:
            at, seq, episode_id = self._heap[0]
            if self._live.get(episode_id) == seq:
                return at
            heapq.heappop(self._heap)
        return None

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, episode_id: object) -> bool:
        return episode_id in self._live
