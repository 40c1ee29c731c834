"""VersionGate: the max_staleness rule tryloop train and the simulator share."""

from __future__ import annotations

import asyncio

from tryloop.train.staleness import VersionGate


def test_the_gate_accepts_up_to_max_staleness_and_opens_when_the_oldest_allowed_version_is_out():
    async def main() -> None:
        gate = VersionGate(max_staleness=1, pushed=2)
        assert gate.accepts(0) and gate.accepts(1) and not gate.accepts(2)
        assert gate.oldest(4) == 3
        await gate.settled(3)                  # version 2 is out already
        waiter = asyncio.create_task(gate.settled(4))
        await asyncio.sleep(0)
        assert not waiter.done()
        gate.push(3)
        await asyncio.wait_for(waiter, 1)
        assert gate.pushed == 3 and gate.ready(1).is_set() and not gate.ready(4).is_set()

    asyncio.run(main())


def test_max_staleness_zero_waits_for_the_steps_own_weights():
    gate = VersionGate(max_staleness=0)
    assert gate.accepts(0) and not gate.accepts(1)
    assert gate.oldest(5) == 5
