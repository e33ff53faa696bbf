"""Two scheduler replicas in one process, each with its own locker (connection), and
what they ran: the harness of the server-side loss tests."""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import multilock
from multilock import EventKind, JobEvent

__all__ = ["INTERVAL", "Outcome", "run_replicas"]

INTERVAL = 2  # seconds between ticks
RUN = 1.5  # how long each run takes: a fault lands while it runs
SKEW = 0.1  # skew_tolerance: one host, one clock; the hold is 2 x 0.1 + 0.3 (grace) = 0.5 s
LEASE_TTL = 0.6  # TTL backends: the ttl past the hold, so a loss is noticed in < 1 s
AFTER_RECOVERY_TICKS = 3


@dataclass
class Outcome:
    """What happened around the fault."""

    broken_tick: float
    """Fire time (epoch seconds) of the run the fault hit."""
    victim: int
    fault_at: float
    """time.time() when the fault was injected (or, for a restart, when the server was back)."""
    lost_after: float | None
    """Seconds from the fault to the victim's ``lease_lost``, if it fired."""
    cancelled: bool
    """Whether the hit run saw its cancellation."""
    recovered_at: float
    """time.time() by which the backend was reachable again."""
    settle: float
    """Seconds after recovery before every tick must run exactly once."""
    finished: list[tuple[float, int]] = field(default_factory=list)
    """(fire time, replica) of every run that completed."""
    events: list[JobEvent] = field(default_factory=list)

    def runs_per_tick(self) -> Counter[float]:
        """How many replicas completed each tick."""
        return Counter(fire for fire, _ in self.finished)

    def later_ticks(self) -> list[float]:
        """The ticks that must run exactly once: those after recovery."""
        first = math.ceil((self.recovered_at + self.settle) / INTERVAL) * INTERVAL
        last = max((fire for fire, _ in self.finished), default=first)
        return [float(t) for t in range(int(first), int(last) + 1, INTERVAL)]


Fault = Callable[[int, Any], Awaitable[float]]
"""``fault(victim, its locker)``: inject it; return when the backend is back (time.time())."""


async def run_replicas(
    url: str, name: str, fault: Fault, lost_within: float, settle: float = 0.5
) -> Outcome:
    """Run two replicas of one job until a run starts, inject ``fault`` into the
    replica running it, then keep going for a few ticks after recovery (plus
    ``settle`` seconds, the backend's own bound for a lease left behind)."""
    finished: list[tuple[float, int]] = []
    cancelled: list[tuple[float, int]] = []
    events: list[tuple[float, int, JobEvent]] = []
    started = asyncio.Event()

    async def body(replica: int) -> None:
        fire = multilock.current_run().fire_time.timestamp()
        try:
            await asyncio.sleep(RUN)
        except asyncio.CancelledError:
            cancelled.append((fire, replica))
            raise
        finished.append((fire, replica))

    def listener(replica: int) -> Callable[[JobEvent], None]:
        def on(event: JobEvent) -> None:
            events.append((time.monotonic(), replica, event))
            if event.kind is EventKind.STARTED:
                started.set()

        return on

    lockers = [multilock.connect_async(url) for _ in range(2)]
    schedulers = []
    for i, locker in enumerate(lockers):
        scheduler = multilock.Scheduler(
            locker,
            skew_tolerance=SKEW,
            misfire_grace=0.3,
            lease_ttl=LEASE_TTL,
            stop_timeout=5,
            replica_id=f"r{i}",
            metrics=False,
        )
        scheduler.add_job(body, multilock.every(seconds=INTERVAL), name=name, args=(i,))
        scheduler.add_listener(listener(i))
        schedulers.append(scheduler)
    try:
        for scheduler in schedulers:
            await scheduler.start()
        await asyncio.wait_for(started.wait(), INTERVAL * 3)
        await asyncio.sleep(0.2)  # well inside the run
        _, victim, hit = next(e for e in events if e[2].kind is EventKind.STARTED)
        broken = hit.fire_time.timestamp()
        fault_at, fault_mono = time.time(), time.monotonic()
        recovered_at = await fault(victim, lockers[victim])
        lost_at = await _lost(events, victim, broken, lost_within)
        await _sleep_until(
            math.ceil((recovered_at + settle) / INTERVAL) * INTERVAL
            + AFTER_RECOVERY_TICKS * INTERVAL
            + RUN
            + 0.5
        )
    finally:
        for scheduler in schedulers:
            await scheduler.stop()
        for locker in lockers:
            await locker.aclose()
    return Outcome(
        broken,
        victim,
        fault_at,
        None if lost_at is None else lost_at - fault_mono,
        (broken, victim) in cancelled,
        recovered_at,
        settle,
        finished,
        [e for _, _, e in events],
    )


async def _lost(
    events: list[tuple[float, int, JobEvent]], victim: int, tick: float, within: float
) -> float | None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        for at, replica, event in events:
            if (
                replica == victim
                and event.kind is EventKind.LEASE_LOST
                and event.fire_time.timestamp() == tick
            ):
                return at
        await asyncio.sleep(0.01)
    return None


async def _sleep_until(when: float) -> None:
    await asyncio.sleep(max(0.0, when - time.time()))
