"""A priority queue with updatable priorities; equal priorities come out first-in, first-out."""

import heapq
import itertools

_REMOVED = object()


class PriorityQueue:
    """Lowest priority value first."""

    def __init__(self):
        self._heap = []
        self._entries = {}
        self._counter = itertools.count()

    def __len__(self):
        return len(self._entries)

    def __contains__(self, item):
        return item in self._entries

    def push(self, item, priority):
        """Add `item`, or change its priority if it is already queued (it then goes to the back
        of its new priority)."""
        if item in self._entries:
            self.remove(item)
        entry = [priority, next(self._counter), item]
        self._entries[item] = entry
        heapq.heappush(self._heap, entry)

    def remove(self, item):
        """Take `item` out of the queue; KeyError if it is not queued."""
        entry = self._entries.pop(item)
        entry[2] = _REMOVED

    def _discard_removed(self):
        while self._heap and self._heap[0][2] is _REMOVED:
            heapq.heappop(self._heap)

    def peek(self):
        """(item, priority) that pop would return, without removing it."""
        self._discard_removed()
        if not self._heap:
            raise IndexError("peek from an empty queue")
        priority, _, item = self._heap[0]
        return item, priority

    def pop(self):
        """Remove and return (item, priority) with the lowest priority."""
        self._discard_removed()
        if not self._heap:
            raise IndexError("pop from an empty queue")
        priority, _, item = heapq.heappop(self._heap)
        del self._entries[item]
        return item, priority

    def priority(self, item):
        return self._entries[item][0]

    def drain(self):
        """Pop everything, in order, as a list of items."""
        out = []
        while self:
            out.append(self.pop()[0])
        return out
