"""A lock granted past the misfire grace does not run its tick.

Found by the failover fleets (tests/reliability/test_rel_failover_pg_zk.py): while a
ZooKeeper ensemble elects a new leader, every replica's acquire waits for its
connection, and they come back at different times. The first one back wins the tick,
runs it and releases at the end of its hold; one back later than that finds the name
free and ran the tick again. Lateness was only checked before the lock was asked for;
a grant that comes back after ``misfire_grace`` cannot rule out a winner whose hold
has ended (the hold covers tries up to ``misfire_grace`` late, no more), so the tick
is missed, the lease given back at once.

Two replicas on memory:// with one manual clock; the second one's acquire is held at
a gate until the first one's hold is over.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime

from multilock import EventKind, JobEvent, ManualClock, Scheduler, every
from multilock._locks.memory import AsyncMemoryLocker
from multilock.abc import AsyncLease
from multilock.backend import AsyncLeaseBase, Duration, LockURL, Outcome

T0 = 1_800_000_000.0
SKEW, GRACE = 0.1, 0.2  # the winner holds its lease until 2 x 0.1 + 0.2 = 0.4 s after


class GatedLocker(AsyncMemoryLocker):
    """memory:// whose acquires wait until :attr:`gate` is open, as a client whose
    connection is being re-established does."""

    def __init__(self, url: str) -> None:
        super().__init__(LockURL.parse(url))
        self.gate = asyncio.Event()
        self.waiting = asyncio.Event()

    def try_acquire_many_started(
        self, names: Iterable[str], *, ttl: Duration | None = None
    ) -> Outcome[Mapping[str, AsyncLease | None]] | None:
        return None  # not at once: the scheduler awaits try_acquire_many

    async def try_acquire_many(
        self, names: Iterable[str], *, ttl: Duration | None = None
    ) -> dict[str, AsyncLeaseBase | None]:
        self.waiting.set()
        await self.gate.wait()
        return await super().try_acquire_many(names, ttl=ttl)


async def _settle(rounds: int = 50) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)


async def nothing() -> None:
    """The job."""


def test_a_grant_past_the_misfire_grace_does_not_run_the_tick() -> None:
    url = f"memory://late-{uuid.uuid4().hex[:10]}"
    clock = ManualClock(T0 + 0.9)
    seen: list[JobEvent] = []

    async def scenario() -> None:
        slow = GatedLocker(url)
        replicas = []
        for name, lock in (("prompt", url), ("slow", slow)):
            sched = Scheduler(
                lock,
                clock=clock,
                metrics=False,
                replica_id=name,
                skew_tolerance=SKEW,
                misfire_grace=GRACE,
                stop_timeout=0.1,
                tick_claims=False,  # the hold path's late grant (claims need no hold)
            )
            sched.add_job(nothing, every(seconds=1), name="job")
            sched.add_listener(seen.append)
            replicas.append(sched)
        await replicas[0].start()
        slow.gate.set()  # the probe at start goes through
        await replicas[1].start()
        slow.gate.clear()
        clock.set(T0 + 1.0)  # tick 1: the prompt replica runs it; the slow one's ask waits
        await _settle()
        await asyncio.wait_for(slow.waiting.wait(), 5)
        clock.set(T0 + 1.5)  # the prompt replica's hold is over: the name is free again
        await _settle()
        slow.gate.set()  # the slow replica's grant comes back 0.5 s late
        await _settle()
        for sched in replicas:
            await sched.stop()

    asyncio.run(scenario())
    tick = datetime.fromtimestamp(T0 + 1, UTC)
    started = [e.replica_id for e in seen if e.kind is EventKind.STARTED and e.fire_time == tick]
    assert started == ["prompt"]
    missed = [e for e in seen if e.kind is EventKind.MISSED and e.fire_time == tick]
    assert [e.replica_id for e in missed] == ["slow"]
    assert missed[0].reason is not None
    assert "granted" in missed[0].reason
