"""Mutual exclusion under contention, within one process, and fencing tokens."""

from __future__ import annotations

import asyncio
from itertools import pairwise
from typing import Any

from multilock.abc import Capability

from ._harness import Harness

__all__ = [
    "CONTENDERS",
    "ROUNDS",
    "exclusion_free_running",
    "exclusion_rounds",
    "fencing_increases",
    "shared_locker_excludes",
]

CONTENDERS = 8
ROUNDS = 100


class _Counter:
    """A shared counter updated non-atomically: read, yield, write. Two holders at
    once lose an update, so the final value betrays any overlap."""

    def __init__(self) -> None:
        self.value = 0
        self.inside = 0
        self.overlaps = 0

    def enter(self) -> int:
        """A holder starts its update: note any overlap, read the value."""
        self.inside += 1
        if self.inside > 1:
            self.overlaps += 1
        return self.value

    def leave(self, seen: int) -> None:
        """The holder finishes its update from the value it read."""
        self.value = seen + 1
        self.inside -= 1

    async def bump(self) -> None:
        """A whole update, yielding to every other contender in the middle."""
        seen = self.enter()
        await asyncio.sleep(0)
        self.leave(seen)


async def exclusion_rounds(h: Harness) -> None:
    """8 independent lockers race for one name, all at once, 100 times: one winner a round."""
    name = h.name("rounds")
    lockers = [await h.api.connect() for _ in range(CONTENDERS)]
    barrier = asyncio.Barrier(CONTENDERS)
    counter = _Counter()
    winners = [0] * ROUNDS

    async def contender(locker: Any) -> None:
        for round_ in range(ROUNDS):
            await barrier.wait()
            lease = await h.api.try_acquire(locker, name)
            if lease is not None:
                winners[round_] += 1
                seen = counter.enter()
            await barrier.wait()  # every contender has tried while the winner holds
            if lease is not None:
                counter.leave(seen)
                assert await h.api.release(lease) is True
            await barrier.wait()  # released before the next round starts

    await asyncio.gather(*(contender(locker) for locker in lockers))
    bad = {round_: count for round_, count in enumerate(winners) if count != 1}
    assert not bad, f"rounds without exactly one winner (round: winners): {bad}"
    assert counter.overlaps == 0, f"{counter.overlaps} acquisitions overlapped another holder"
    assert counter.value == ROUNDS, f"the guarded counter is {counter.value}, not {ROUNDS}"


async def exclusion_free_running(h: Harness) -> None:
    """8 independent lockers each loop try/update/release; no update is ever lost."""
    name = h.name("free")
    lockers = [await h.api.connect() for _ in range(CONTENDERS)]
    counter = _Counter()
    wins = [0] * CONTENDERS
    per_contender = max(1, (ROUNDS * 2) // CONTENDERS)

    async def contender(i: int, locker: Any) -> None:
        while wins[i] < per_contender:
            lease = await h.api.try_acquire(locker, name)
            if lease is None:
                await asyncio.sleep(0.001)
                continue
            await counter.bump()
            wins[i] += 1
            assert await h.api.release(lease) is True

    await asyncio.gather(*(contender(i, locker) for i, locker in enumerate(lockers)))
    total = per_contender * CONTENDERS
    assert counter.overlaps == 0, f"{counter.overlaps} acquisitions overlapped another holder"
    assert counter.value == total, f"the guarded counter is {counter.value}, not {total}"


async def shared_locker_excludes(h: Harness) -> None:
    """Two acquirers sharing ONE locker exclude each other (no re-entrancy)."""
    locker = await h.api.connect()
    name = h.name("shared")
    first = await h.api.try_acquire(locker, name)
    assert first is not None
    again = await h.api.try_acquire(locker, name)
    assert again is None, (
        "the same locker was granted a name it already holds: leases are re-entrant"
        " (a second job in this process would run concurrently with the first)"
    )
    assert await h.api.release(first) is True
    for round_ in range(20):
        pair = await asyncio.gather(
            h.api.try_acquire(locker, name), h.api.try_acquire(locker, name)
        )
        granted = [lease for lease in pair if lease is not None]
        assert len(granted) == 1, (
            f"round {round_}: two concurrent acquirers on one locker got {len(granted)} leases"
        )
        assert await h.api.release(granted[0]) is True


async def fencing_increases(h: Harness) -> None:
    """Fencing tokens strictly increase per name across holders and lockers."""
    h.requires(Capability.FENCING)
    name = h.name("fence")
    lockers = [await h.api.connect() for _ in range(3)]
    seen: list[int] = []
    for i in range(12):
        lease = await h.api.try_acquire(lockers[i % 3], name)
        assert lease is not None
        token = lease.fencing_token
        assert type(token) is int, f"a FENCING backend gave fencing_token={token!r}"
        seen.append(token)
        assert await h.api.release(lease) is True
    assert all(a < b for a, b in pairwise(seen)), f"fencing tokens do not strictly increase: {seen}"
    other = await h.api.try_acquire(lockers[0], h.name("fence-other"))
    assert other is not None
    assert type(other.fencing_token) is int
    await h.api.release(other)
