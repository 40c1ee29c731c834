"""The staleness gate of an overlapped run: which weights version an episode may be sampled with.

Step s trains from weights version s (0: the loaded weights; s + 1 is pushed after step s's
update). An episode is as stale as its oldest token: s - v for tokens of version v. More than
`max_staleness` behind, it is dropped and sampled again, but only once version s - max_staleness
is out, so that nothing sampled from then on can be too stale. `tryloop train` and the simulator
(`tryloop.scheduler.sim`) both keep this rule through `VersionGate`.

No tryloop imports: the simulator imports it without the `train` extra.
"""

from __future__ import annotations

import asyncio


class VersionGate:
    """The versions a run has pushed, and its `max_staleness` rule over them."""

    def __init__(self, max_staleness: int, pushed: int = 0) -> None:
        self.max_staleness = max_staleness
        self.pushed = pushed        # the newest version out
        self._ready: dict[int, asyncio.Event] = {}

    def accepts(self, staleness: int) -> bool:
        """Whether an episode `staleness` versions behind its step may be trained on."""
        return staleness <= self.max_staleness

    def oldest(self, step: int) -> int:
        """The oldest version step `step` may train on episodes of."""
        return step - self.max_staleness

    def ready(self, version: int) -> asyncio.Event:
        """Set once `version` is out."""
        ev = self._ready.setdefault(version, asyncio.Event())
        if version <= self.pushed:
            ev.set()
        return ev

    def push(self, version: int) -> None:
        """`version` is out: episodes sampled from now on are of it (or newer)."""
        self.pushed = version
        self.ready(version).set()

    async def settled(self, step: int) -> None:
        """Until an episode of step `step` sampled again can no longer be too stale: its oldest
        allowed version is out."""
        await self.ready(self.oldest(step)).wait()
