"""Bursts: many jobs due at one instant are prepared ahead of it (ticks claimed, locks
taken, runs made) and their bodies start at the instant, never before it; a stop in
between runs none of them and leaves no lock; a job busy when its burst is prepared is
decided at its instant, as it would have been without the lead."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import datetime

import pytest

import multilock
import multilock._scheduling.scheduler as scheduling
from multilock import EventKind, ManualClock, current_run, every
from multilock._locks.memory import AsyncMemoryLocker
from multilock._scheduling.run_states import RunState, record_transitions
from multilock.backend import LockURL
from tests.test_scheduler import (
    T0,
    Events,
    held_names,
    manual,
    namespace,
    scheduler,
    settle,
)

JOBS = scheduling._BURST + 10
PER_JOB = 0.001  # seconds of lead a job: JOBS of them prepare 60 ms ahead
LEAD = JOBS * PER_JOB


@pytest.fixture(autouse=True)
def wide_lead(monkeypatch: pytest.MonkeyPatch) -> None:
    """A lead of tens of milliseconds, so that a manual clock can stop inside it."""
    monkeypatch.setattr(scheduling, "_LEAD_PER_JOB", PER_JOB)


def _add_burst(
    sched: multilock.Scheduler, clock: ManualClock, starts: list[tuple[datetime, float]]
) -> None:
    async def job() -> None:
        starts.append((current_run().fire_time, clock.now()))

    for index in range(JOBS):
        sched.add_job(job, every(seconds=10), name=f"burst-{index}")


@pytest.mark.parametrize("claims", [False, True], ids=["hold", "claims"])
def test_a_burst_is_locked_ahead_and_its_bodies_start_at_its_instant(claims: bool) -> None:
    url, clock, events = namespace(), manual(), Events()
    starts: list[tuple[datetime, float]] = []

    async def scenario() -> None:
        sched = scheduler(url, clock, events, tick_claims=claims)
        _add_burst(sched, clock, starts)
        async with sched:
            await settle()
            clock.set(T0 + 10 - LEAD / 2)  # inside the lead
            await settle()
            assert len(held_names(url)) == JOBS, "locked ahead"
            assert starts == []
            assert events.of(EventKind.STARTED) == []
            clock.set(T0 + 10)
            await settle()
            assert len(starts) == JOBS

    asyncio.run(scenario())
    assert {fire.timestamp() for fire, _ in starts} == {T0 + 10}
    assert all(now >= fire.timestamp() for fire, now in starts), "a body started early"
    delays = [e.delay for e in events.of(EventKind.STARTED)]
    assert len(delays) == JOBS
    assert all(d is not None and 0 <= d < 1e-6 for d in delays)


@pytest.mark.parametrize("instant", [False, True], ids=["cut-short", "past-the-instant"])
def test_a_stop_within_the_lead_runs_no_body_and_leaves_no_lock(instant: bool) -> None:
    """A stop inside the lead: cut short (its timeout ends the wait for the instant), or
    waiting for its runs while the instant comes: no prepared body starts either way."""
    url, clock, events = namespace(), manual(), Events()
    starts: list[tuple[datetime, float]] = []

    async def scenario() -> None:
        sched = scheduler(url, clock, events, stop_timeout=5 if instant else 0.05)
        _add_burst(sched, clock, starts)
        await sched.start()
        await settle()
        clock.set(T0 + 10 - LEAD / 2)
        await settle()
        assert len(held_names(url)) == JOBS
        stopping = asyncio.ensure_future(sched.stop())
        await settle()
        if instant:
            clock.set(T0 + 10)
        await stopping
        clock.set(T0 + 11)
        await settle()

    with record_transitions() as seen:
        asyncio.run(scenario())
    assert starts == []
    assert events.of(EventKind.STARTED) == []
    assert held_names(url) == []
    ends = Counter(
        move.after for move in seen if not move.legal or move.after is RunState.ABANDONED
    )
    assert ends == {RunState.ABANDONED: JOBS}


def test_a_lease_lost_between_preparation_and_instant_stops_its_body_unstarted() -> None:
    url, clock, events = namespace(), manual(), Events()
    starts: list[tuple[datetime, float]] = []

    async def scenario() -> None:
        sched = scheduler(url, clock, events)
        _add_burst(sched, clock, starts)
        async with sched:
            await settle()
            clock.set(T0 + 10 - LEAD / 2)
            await settle()
            assert AsyncMemoryLocker(LockURL.parse(url)).revoke("burst-0", "connection killed")
            clock.set(T0 + 10)
            await settle()

    asyncio.run(scenario())
    assert len(starts) == JOBS - 1
    (lost,) = events.of(EventKind.LEASE_LOST)
    assert (lost.job, lost.reason) == ("burst-0", "connection killed")


def test_a_job_busy_when_its_burst_is_prepared_is_decided_at_its_instant() -> None:
    """Its previous run ends inside the lead: at its instant it is free, so it runs
    (prepared ahead, it would have been skipped as still running)."""
    url, clock, events = namespace(), manual(), Events()
    release = asyncio.Event
    ran: list[float] = []

    async def scenario() -> None:
        gate = release()

        async def slow() -> None:
            ran.append(current_run().fire_time.timestamp() - T0)
            if len(ran) == 1:
                await gate.wait()

        sched = scheduler(url, clock, events)
        _add_burst(sched, clock, [])
        sched.add_job(slow, every(seconds=10), name="slow")
        async with sched:
            await settle()
            clock.set(T0 + 10)
            await settle()
            assert ran == [10]
            clock.set(T0 + 20 - LEAD / 2)  # the others are prepared; slow still runs
            await settle()
            assert len(held_names(url)) == JOBS + 1  # slow's lease is its running tick's
            gate.set()
            await settle()
            clock.set(T0 + 20)
            await settle()
            assert ran == [10, 20]

    asyncio.run(scenario())
    assert events.of(EventKind.SKIPPED_OVERLAP) == []
    assert sorted(events.fires(EventKind.SUCCEEDED)).count(20) == JOBS + 1


@pytest.mark.parametrize("claims", [False, True], ids=["hold", "claims"])
def test_skewed_replicas_prepared_ahead_run_each_tick_of_a_burst_once(claims: bool) -> None:
    """Three replicas 300 ms apart (tolerance 400 ms), each preparing its bursts 60 ms
    ahead of its own clock: every job's every tick starts once, at or after its time."""
    url, clock, events = namespace(), manual(), Events()

    async def scenario() -> None:
        replicas = []
        for i, offset in enumerate((-0.3, 0.0, 0.3)):
            own = clock.shifted(offset)
            sched = scheduler(
                url, own, events, replica_id=f"r{i}", tick_claims=claims,
                skew_tolerance=0.4, misfire_grace=0.15, stop_timeout=0.1,
            )  # fmt: skip
            for index in range(JOBS):
                sched.add_job(_nothing, every(seconds=1), name=f"burst-{index}")
            replicas.append(sched)
            await sched.start()
        while clock.now() < T0 + 6.5:
            clock.advance(0.02)
            await settle()
        for sched in replicas:
            await sched.stop()

    asyncio.run(scenario())
    started = Counter(
        (e.job, round(e.fire_time.timestamp() - T0, 3)) for e in events.of(EventKind.STARTED)
    )
    ticks = {float(t) for t in range(2, 7)}
    for index in range(JOBS):
        runs = {tick: n for (job, tick), n in started.items() if job == f"burst-{index}"}
        assert {t: runs.get(t, 0) for t in ticks} == dict.fromkeys(ticks, 1), f"burst-{index}"
    assert all(n == 1 for n in started.values())
    assert all(e.delay is not None and e.delay >= 0 for e in events.of(EventKind.STARTED))


async def _nothing() -> None:
    """A job that does nothing."""
