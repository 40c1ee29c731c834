"""How episodes are run side by side: `fn(request, hooks)` for each request, results
yielded as they finish. `ScheduledRunner` (tryloop.eval.scheduled) runs them through the
scheduler — retries, timeouts, breakers, co-scheduled capacity, metrics — and is what `tryloop
eval` and `tryloop train` use; `BoundedRunner` is the bare minimum (bounded concurrency).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Protocol, TypeVar

from tryloop.agent.episode import EpisodeHooks

R = TypeVar("R")
Q = TypeVar("Q")


EpisodeFn = Callable[[Q, EpisodeHooks], Awaitable[R]]


class EpisodeRunner(Protocol):
    def run(self, requests: Sequence[Q], fn: EpisodeFn) -> AsyncIterator[R]: ...


class BoundedRunner:
    """At most `concurrency` episodes at once; yields results as they finish. An episode that
    raises is not retried: it is recorded in `failed` (request, exception) and the run goes on."""

    def __init__(self, concurrency: int = 4):
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        self.concurrency = concurrency
        self.failed: list[tuple[object, BaseException]] = []

    async def run(self, requests, fn):
        queue: asyncio.Queue = asyncio.Queue()
        it = iter(requests)
        pending: set[asyncio.Task] = set()

        def launch() -> bool:
            req = next(it, None)
            if req is None:
                return False
            t = asyncio.create_task(fn(req, EpisodeHooks()))
            t.request = req  # type: ignore[attr-defined]
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
                if done.exception() is not None:
                    self.failed.append((done.request, done.exception()))
                    continue
                yield done.result()
        finally:
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
