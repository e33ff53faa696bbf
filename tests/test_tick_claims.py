"""The scheduler on a backend that claims ticks (memory://, manual clocks): each tick runs
once whatever the clock offsets, runs never overlap, and the documented limits."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Any

import pytest

from multilock import EventKind, Scheduler, current_run, every
from multilock._locks.memory import AsyncMemoryLocker
from multilock.backend import LockURL, Outcome
from multilock.errors import ClaimsUnavailable
from tests.test_scheduler import (
    T0,
    Events,
    _counts,
    _run_replicas,
    _walk,
    at,
    manual,
    namespace,
    nothing,
    scheduler,
    settle,
)

CLAIMS: dict[str, Any] = {"tick_claims": True, "skew_tolerance": 0.25, "misfire_grace": 0.25}


@pytest.mark.parametrize("interval", [1, 2])
def test_offsets_of_almost_half_an_interval_run_each_tick_once(interval: int) -> None:
    """Clocks -0.45 I, 0, +0.45 I off true time: far past skew_tolerance (0.25 s), yet
    every tick runs once; the replicas that come later find it claimed."""
    url, clock, events = namespace(), manual(), Events()
    offsets = (-0.45 * interval, 0.0, 0.45 * interval)

    until = 12 * interval + 0.5
    asyncio.run(
        _run_replicas(url, clock, offsets, events, until=until, interval=interval, **CLAIMS)
    )
    counts = _counts(events)
    assert set(counts.values()) == {1}
    assert set(counts) >= {float(t) for t in range(interval, 12 * interval + 1, interval)}
    held = events.of(EventKind.SKIPPED_HELD)
    assert held
    assert {e.reason for e in held} == {"another replica claimed it"}
    assert {e.tick_path for e in events.seen} == {"claim"}


def test_the_same_offsets_on_the_hold_path_run_ticks_twice() -> None:
    """The control: holding the lock (tick_claims=False) cannot cover offsets past the
    skew tolerance; the documented duplicates (every tick twice, at 2 s ticks)."""
    url, clock, events = namespace(), manual(), Events()
    options = CLAIMS | {"tick_claims": False}

    asyncio.run(
        _run_replicas(url, clock, (-0.9, 0.0, 0.9), events, until=12.5, interval=2, **options)
    )
    counts = _counts(events)
    assert {fire: counts[fire] for fire in (4.0, 6.0, 8.0, 10.0)} == dict.fromkeys(
        (4.0, 6.0, 8.0, 10.0), 2
    )
    assert {e.tick_path for e in events.seen} == {"hold"}


@pytest.mark.parametrize("interval", [1, 2])
def test_a_clock_jumping_forward_and_back_two_intervals_runs_each_tick_once(
    interval: int,
) -> None:
    """One replica's clock jumps 2 I ahead mid-run, later back: it runs the ticks it
    jumped over that nobody ran yet (they are within an interval of its new now), then
    early ones while ahead; back, it finds them all claimed. Every tick once."""
    url, clock, events = namespace(), manual(), Events()

    async def scenario() -> None:
        clocks = [clock.shifted(offset) for offset in (-0.45 * interval, 0.0, 0.45 * interval)]
        replicas = []
        for i, own in enumerate(clocks):
            sched = scheduler(url, own, events, replica_id=f"r{i}", stop_timeout=0.1, **CLAIMS)
            sched.add_job(nothing, every(seconds=interval), name="job")
            replicas.append(sched)
            await sched.start()
        await _walk(clock, T0 + 4.5 * interval)
        clocks[1].offset = 2.0 * interval  # jumps forward mid-way between two ticks
        await _walk(clock, T0 + 9.5 * interval)
        clocks[1].offset = 0.0  # and back
        await _walk(clock, T0 + 16.5 * interval)
        for sched in replicas:
            await sched.stop()

    asyncio.run(scenario())
    counts = _counts(events)
    assert set(counts.values()) == {1}, counts
    assert set(counts) >= {float(t) for t in range(interval, 16 * interval + 1, interval)}


def test_a_replica_more_than_an_interval_ahead_runs_ticks_early_but_once() -> None:
    """The limit: a clock 1.5 intervals ahead computes other ticks (it runs each one an
    interval and a half early), but no tick twice."""
    url, clock, events = namespace(), manual(), Events()
    starts: list[tuple[float, float]] = []

    async def noted() -> None:
        starts.append((current_run().fire_time.timestamp() - T0, clock.now() - T0))

    async def scenario() -> None:
        replicas = []
        for i, offset in enumerate((0.0, 1.5)):
            sched = scheduler(url, clock.shifted(offset), events, replica_id=f"r{i}", **CLAIMS)
            sched.add_job(noted, every(seconds=1), name="job")
            replicas.append(sched)
            await sched.start()
        await _walk(clock, T0 + 10.5)
        for sched in replicas:
            await sched.stop()

    asyncio.run(scenario())
    fires = Counter(fire for fire, _ in starts)
    assert max(fires.values()) == 1
    assert all(fire - true >= 1.4 for fire, true in starts if fire > 4)  # all run early


def test_a_tick_claimed_by_a_replica_that_crashed_before_running_it_is_lost() -> None:
    """The limit: a claim is the record that a tick ran. A replica that claimed the tick
    and died before its run leaves it claimed: nobody runs it; the next tick runs."""
    url, clock, events = namespace(), manual(), Events()

    async def scenario() -> None:
        replicas = []
        for i, offset in enumerate((0.0, 0.2)):
            sched = scheduler(url, clock.shifted(offset), events, replica_id=f"r{i}", **CLAIMS)
            sched.add_job(nothing, every(seconds=1), name="job")
            replicas.append(sched)
            await sched.start()
        await _walk(clock, T0 + 2.5)
        crashed = AsyncMemoryLocker(LockURL.parse(url))
        assert await crashed.claim_tick("job", at(3)) is True  # then it died
        await _walk(clock, T0 + 5.5)
        for sched in replicas:
            await sched.stop()

    asyncio.run(scenario())
    assert _counts(events) == {1.0: 1, 2.0: 1, 4.0: 1, 5.0: 1}


def test_runs_of_a_claimed_job_never_overlap_across_replicas() -> None:
    """The lock still guards a run while it runs: a body longer than the interval keeps
    the other replica's claimed tick from starting (skipped, held), never overlapping."""
    url, clock, events = namespace(), manual(), Events()
    running: list[str] = []
    overlaps: list[float] = []

    async def scenario() -> None:
        gate = asyncio.Event()

        async def long() -> None:
            if running:
                overlaps.append(clock.now())
            running.append(current_run().replica_id)
            await gate.wait()
            running.pop()

        replicas = []
        for i, offset in enumerate((0.0, 0.45)):
            sched = scheduler(url, clock.shifted(offset), events, replica_id=f"r{i}", **CLAIMS)
            sched.add_job(long, every(seconds=1), name="job")
            replicas.append(sched)
            await sched.start()
        await _walk(clock, T0 + 4.5)
        gate.set()
        await settle()
        for sched in replicas:
            await sched.stop()

    asyncio.run(scenario())
    assert overlaps == []
    assert _counts(events) == {1.0: 1}  # the first run held the job's lock throughout
    assert any(e.reason == "another replica holds it" for e in events.of(EventKind.SKIPPED_HELD))


class _RefusingLocker(AsyncMemoryLocker):
    """memory://, but a locker the backend refuses claims to (a PostgreSQL role that
    may not make the claims table)."""

    async def _claim_ticks(self, names: list[str], fires: list[int]) -> list[bool]:
        raise ClaimsUnavailable("this role may not create the tick claims table")

    def _start_claim_ticks(self, names: list[str], fires: list[int]) -> Outcome[list[bool]]:
        refused: Outcome[list[bool]] = Outcome(loop=asyncio.get_running_loop())
        refused.set_exception(ClaimsUnavailable("this role may not create the tick claims table"))
        return refused


class _SlowRefusingLocker(_RefusingLocker):
    """The same, for claims that cannot start at once (awaited in a task)."""

    def _start_claim_ticks(self, names: list[str], fires: list[int]) -> None:  # type: ignore[override]
        return None


@pytest.mark.parametrize("refusing", [_RefusingLocker, _SlowRefusingLocker])
def test_a_backend_refusing_claims_falls_back_to_holds(
    caplog: pytest.LogCaptureFixture, refusing: type[AsyncMemoryLocker]
) -> None:
    url, clock, events = namespace(), manual(), Events()

    async def scenario() -> Scheduler:
        locker: Any = refusing(LockURL.parse(url))
        sched = scheduler(locker, clock, events, stop_timeout=0.1, **CLAIMS)
        sched.add_job(nothing, every(seconds=1), name="job")
        job = sched.jobs[0]
        assert sched.tick_path(job) == "claim"
        async with sched:
            await _walk(clock, T0 + 3.5)
        assert sched.tick_path(job) == "hold"
        return sched

    with caplog.at_level(logging.WARNING, "multilock.scheduler"):
        asyncio.run(scenario())
    assert _counts(events) == {1.0: 1, 2.0: 1, 3.0: 1}
    warnings = [r.getMessage() for r in caplog.records if "tick claims unavailable" in r.message]
    assert len(warnings) == 1
    assert "may not create the tick claims table" in warnings[0]
    assert [e.tick_path for e in events.of(EventKind.STARTED)] == ["hold"] * 3


def test_tick_path_says_how_each_job_runs_once() -> None:
    url = namespace()
    claiming = Scheduler(url, metrics=False)
    holding = Scheduler(url, metrics=False, tick_claims=False)
    leading = Scheduler(url, metrics=False, coordination="leader")
    for sched in (claiming, holding, leading):
        sched.add_job(nothing, every(seconds=1), name="shared")
        sched.add_job(nothing, every(seconds=1), name="local", distributed=False)
    paths = [[s.tick_path(job) for job in s.jobs] for s in (claiming, holding, leading)]
    assert paths == [["claim", "local"], ["hold", "local"], ["leader", "local"]]


def test_claims_start_at_once_on_memory_and_not_where_there_is_no_hook() -> None:
    """memory:// answers a started claim at once (the scheduler claims from its timer,
    without a task); a kit backend without ``_start_claim_ticks`` starts nothing."""

    async def scenario() -> None:
        url = LockURL.parse(namespace())
        claimer = AsyncMemoryLocker(url)
        started = claimer.claim_ticks_started({"a": T0, "b": at(0)})
        assert started is not None
        assert started.done()
        assert started.result() == {"a": True, "b": True}
        again = claimer.claim_ticks_started({"a": T0, "b": T0 + 1})
        assert again is not None
        assert again.result() == {"a": False, "b": True}
        assert await claimer.claim_ticks({"a": T0 + 1}) == {"a": True}  # the same marks
        assert _SlowRefusingLocker(url).claim_ticks_started({"a": T0 + 2}) is None
        assert await claimer.claim_ticks({"a": T0 + 2}) == {"a": True}  # nothing was claimed

    asyncio.run(scenario())
