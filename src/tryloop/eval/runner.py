"""How episodes are run side by side. The scheduler (tryloop.scheduler) implements the same
contract with retries, priorities, breakers and a journal; this runner is the bare minimum:
bounded concurrency, results in completion order.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Protocol, TypeVar

R = TypeVar("R")
Q = TypeVar("Q")


class EpisodeRunner(Protocol):
    def run(self, requests: Sequence[Q], fn: Callable[[Q], Awaitable[R]]) -> AsyncIterator[R]: ...


class BoundedRunner:
    """At most `concurrency` episodes at once; yields results as they finish."""

    def __init__(self, concurrency: int = 4):
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        self.concurrency = concurrency

    async def run(self, requests, fn):
        queue: asyncio.Queue = asyncio.Queue()
        it = iter(requests)
        pending: set[asyncio.Task] = set()

        def launch() -> bool:
            req = next(it, None)
            if req is None:
                return False
            t = asyncio.create_task(fn(req))
            pending.add(t)
            t.add_done_callback(lambda t: (pending.discard(t), queue.put_nowait(t)))
            return True

        for _ in range(self.concurrency):
            if not launch():
                break
        try:
            while pending or not queue.empty():
                done = await queue.get()
                launch()
                yield done.result()
        finally:
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
