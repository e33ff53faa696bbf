"""The scheduler on memory:// with a manual clock: every time decision is driven by the test."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, cast

import pytest

import multilock
import multilock._scheduling.scheduler
from multilock import EventKind, JobEvent, ManualClock, Scheduler, current_run, every
from multilock._locks.memory import AsyncMemoryLocker
from multilock._scheduling.jobs import Overlap
from multilock._scheduling.run_states import RunLifecycle, RunState
from multilock._scheduling.runs import Run
from multilock._scheduling.scheduler import _JobState
from multilock.abc import AsyncLease
from multilock.backend import LockURL
from multilock.errors import BackendUnavailable, ConfigurationError
from multilock.testing import apoll, poll

T0 = 1_800_000_000.0  # a whole multiple of every interval used here


def namespace() -> str:
    """A fresh memory:// URL: tests never see each other's locks."""
    return f"memory://sched-{uuid.uuid4().hex[:10]}"


def at(seconds: float) -> datetime:
    """The instant ``T0 + seconds``."""
    return datetime.fromtimestamp(T0 + seconds, UTC)


async def settle(rounds: int = 50) -> None:
    """Let every ready task run: memory:// and a manual clock do no real I/O, so a
    bounded number of loop turns lets each scheduler finish reacting."""
    for _ in range(rounds):
        await asyncio.sleep(0)


async def until(check: Callable[[], bool], what: str, within: float = 5.0) -> None:
    """Poll ``check`` until true, or fail naming ``what`` (for work in worker threads)."""

    async def probe() -> bool:
        return check()

    await apoll(what, probe, within, every=0.002)


class Events:
    """A listener that keeps every event."""

    def __init__(self) -> None:
        self.seen: list[JobEvent] = []

    def __call__(self, event: JobEvent) -> None:
        self.seen.append(event)

    def of(self, kind: EventKind, job: str | None = None) -> list[JobEvent]:
        """The events of ``kind`` (for ``job``)."""
        return [e for e in self.seen if e.kind is kind and (job is None or e.job == job)]

    def fires(self, kind: EventKind) -> list[float]:
        """Fire times (seconds after T0) of the events of ``kind``."""
        return [e.fire_time.timestamp() - T0 for e in self.of(kind)]


def scheduler(
    lock: str | multilock.DistributedLock | multilock.AsyncDistributedLock,
    clock: multilock.Clock,
    events: Events,
    **options: object,
) -> Scheduler:
    """A scheduler on ``lock`` with metrics off and ``events`` listening."""
    options.setdefault("stop_timeout", 2)  # a lease hold left pending at exit costs this
    options.setdefault("tick_claims", False)  # the hold path (claims: test_tick_claims.py)
    made = Scheduler(lock, clock=clock, metrics=False, **options)  # type: ignore[arg-type]
    made.add_listener(events)
    return made


def held_names(url: str) -> list[str | None]:
    """The names held in a memory:// namespace."""
    return [info.name for info in AsyncMemoryLocker(LockURL.parse(url)).locks()]


async def nothing() -> None:
    """A job that does nothing."""


async def blocked(record: list[str], label: str = "cancelled") -> None:
    """A job that waits until cancelled, then records ``label``."""
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        record.append(label)
        raise


def manual() -> ManualClock:
    """A manual clock just after T0 (tick T0 is beyond the default misfire grace)."""
    return ManualClock(T0 + 1)


# --- one replica ---------------------------------------------------------------------------


def test_runs_each_tick_with_bound_arguments_and_context() -> None:
    url, clock, events = namespace(), manual(), Events()
    seen: list[tuple[Any, ...]] = []

    async def job(a: int, *, b: int) -> None:
        run = current_run()
        seen.append((a, b, run.job, run.fire_time, run.replica_id, run.fencing_token))

    async def scenario() -> None:
        sched = scheduler(url, clock, events, replica_id="r1")
        sched.add_job(job, every(seconds=10), name="tick", args=(1,), kwargs={"b": 2})
        async with sched:
            await settle()
            assert seen == []
            clock.set(T0 + 10)
            await settle()
            # kept until fire + 2 x skew_tolerance + misfire_grace (0.75 s by default)
            assert held_names(url) == ["tick"]
            clock.set(T0 + 10.74)
            await settle()
            assert held_names(url) == ["tick"]
            clock.set(T0 + 10.75)
            await settle()
            assert held_names(url) == []
            clock.set(T0 + 20)
            await settle()
            clock.set(T0 + 21)
            await settle()
        assert held_names(url) == []

    asyncio.run(scenario())
    assert [s[:5] for s in seen] == [(1, 2, "tick", at(10), "r1"), (1, 2, "tick", at(20), "r1")]
    assert all(isinstance(s[5], int) for s in seen)
    assert events.fires(EventKind.SUCCEEDED) == [10, 20]
    (started, _) = events.of(EventKind.STARTED)
    assert started.delay == 0.0


def test_exception_is_logged_counted_and_the_scheduler_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    prometheus = pytest.importorskip("prometheus_client")
    registry = prometheus.CollectorRegistry()
    url, clock, events = namespace(), manual(), Events()
    calls = []

    async def flaky() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise ValueError("boom")

    async def scenario() -> None:
        sched = Scheduler(url, clock=clock, registry=registry, replica_id="r1", stop_timeout=2)
        sched.add_listener(events)
        sched.add_job(flaky, every(seconds=10))
        async with sched:
            for tick in (10, 20, 21):
                clock.set(T0 + tick)
                await settle()

    with caplog.at_level(logging.DEBUG, logger="multilock.scheduler"):
        asyncio.run(scenario())
    assert events.fires(EventKind.FAILED) == [10]
    assert events.fires(EventKind.SUCCEEDED) == [20]
    (failed,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert failed.exc_info is not None
    assert "ValueError: boom" in caplog.text
    assert failed.job == "test_exception_is_logged_counted_and_the_scheduler_goes_on.<locals>.flaky"  # type: ignore[attr-defined]
    assert failed.outcome == "failed"  # type: ignore[attr-defined]
    assert failed.replica_id == "r1"  # type: ignore[attr-defined]
    job = failed.job  # type: ignore[attr-defined]
    value = registry.get_sample_value
    assert value("multilock_job_runs_total", {"job": job, "outcome": "failed"}) == 1
    assert value("multilock_job_runs_total", {"job": job, "outcome": "succeeded"}) == 1
    assert value("multilock_job_duration_seconds_count", {"job": job}) == 2
    assert value("multilock_job_schedule_delay_seconds_count", {"job": job}) == 2
    assert (value("multilock_job_last_success_timestamp_seconds", {"job": job}) or 0) > 0


def test_async_job_past_its_timeout_is_cancelled() -> None:
    url, clock, events = namespace(), manual(), Events()
    outcome: list[str] = []

    async def scenario() -> None:
        sched = scheduler(url, clock, events)
        sched.add_job(blocked, every(seconds=60), name="slow", timeout="30s", args=(outcome,))
        async with sched:
            clock.set(T0 + 60)
            await settle()
            clock.set(T0 + 89.9)
            await settle()
            assert outcome == []
            clock.set(T0 + 90)
            await settle()
            assert held_names(url) == []  # the hold ended long ago (fire + 1 s)

    asyncio.run(scenario())
    assert outcome == ["cancelled"]
    (timed_out,) = events.of(EventKind.TIMED_OUT)
    assert timed_out.duration == 30.0


def test_sync_job_runs_in_a_thread_and_sees_cancellation() -> None:
    url, clock, events = namespace(), manual(), Events()
    seen: list[object] = []

    def blocking() -> None:
        run = current_run()
        seen.append(threading.current_thread() is threading.main_thread())
        seen.append(run.cancel_event.wait(10))  # returns True once the scheduler cancels it

    async def scenario() -> None:
        sched = scheduler(url, clock, events)
        sched.add_job(blocking, every(seconds=60), name="blocking", timeout=5)
        async with sched:
            clock.set(T0 + 60)
            await until(lambda: len(seen) == 1, "the sync job started")
            assert held_names(url) == ["blocking"]
            clock.set(T0 + 65)
            await until(lambda: bool(events.of(EventKind.TIMED_OUT)), "timed_out")

    asyncio.run(scenario())
    assert seen == [False, True]


def test_lost_lease_cancels_the_run() -> None:
    url, clock, events = namespace(), manual(), Events()
    outcome: list[str] = []

    async def scenario() -> None:
        sched = scheduler(url, clock, events)
        sched.add_job(blocked, every(seconds=60), name="guarded", args=(outcome,))
        async with sched:
            clock.set(T0 + 60)
            await settle()
            assert [e.job for e in events.of(EventKind.STARTED)] == ["guarded"]
            AsyncMemoryLocker(LockURL.parse(url)).revoke("guarded", "connection killed")
            await settle()

    asyncio.run(scenario())
    assert outcome == ["cancelled"]
    (lost,) = events.of(EventKind.LEASE_LOST)
    assert lost.reason == "connection killed"


@pytest.mark.parametrize("overlap", ["reschedule", "wait"])
def test_overlap_within_the_process(overlap: Overlap) -> None:
    url, clock, events = namespace(), manual(), Events()
    gate = asyncio.Event()

    async def long() -> None:
        await gate.wait()

    async def scenario() -> None:
        sched = scheduler(url, clock, events)
        sched.add_job(long, every(seconds=10), name="long", overlap=overlap, misfire_grace=5)
        async with sched:
            clock.set(T0 + 10)
            await settle()
            clock.set(T0 + 20)
            await settle()
            clock.set(T0 + 21)  # tick 20 is 1 s late now: still within the 5 s grace
            gate.set()
            await settle()

    asyncio.run(scenario())
    if overlap == "reschedule":
        assert events.fires(EventKind.SKIPPED_OVERLAP) == [20]
        assert events.fires(EventKind.SUCCEEDED) == [10]
    else:
        assert events.fires(EventKind.SKIPPED_OVERLAP) == []
        assert events.fires(EventKind.SUCCEEDED) == [10, 20]


@pytest.mark.parametrize("coalesce", [True, False])
def test_misfire_grace_and_coalescing_after_a_pause(coalesce: bool) -> None:
    url, clock, events = namespace(), manual(), Events()

    async def scenario() -> None:
        sched = scheduler(url, clock, events)
        sched.add_job(nothing, every(seconds=10), name="j", misfire_grace=30, coalesce=coalesce)
        async with sched:
            clock.set(T0 + 45)  # ticks 10, 20, 30, 40 are all due at once
            await settle(200)

    asyncio.run(scenario())
    missed = {e.fire_time.timestamp() - T0: e.reason for e in events.of(EventKind.MISSED)}
    if coalesce:
        assert missed == {10: "35.000s late", 20: "coalesced", 30: "coalesced"}
        assert events.fires(EventKind.SUCCEEDED) == [40]
    else:
        assert missed == {10: "35.000s late"}
        assert events.fires(EventKind.SUCCEEDED) == [20, 30, 40]


def test_default_misfire_grace_drops_a_tick_after_a_long_pause() -> None:
    url, clock, events = namespace(), manual(), Events()

    async def scenario() -> None:
        sched = scheduler(url, clock, events)
        sched.add_job(nothing, every(seconds=10), name="j")
        async with sched:
            clock.set(T0 + 10.3)  # default grace: skew_tolerance = 0.25 s
            await settle()

    asyncio.run(scenario())
    assert events.fires(EventKind.MISSED) == [10]
    assert events.of(EventKind.STARTED) == []


def test_the_next_tick_takes_over_a_lease_still_held() -> None:
    """The hand-over rule, on the job state itself: under load the next tick can be due
    before the previous tick's hold ended; it then runs under that lease. What the job
    state says (ready, running, holding) is read off its current tick's state."""
    url = namespace()
    job = Scheduler(url, clock=manual(), metrics=False).add_job(nothing, every(seconds=10))

    def ready(state: _JobState) -> bool:
        return state.ready  # read through a call: each assert sees the state anew

    def running(state: _JobState) -> bool:
        return state.running

    class Holder:
        """A finished run in its hold: what take_hold hands over."""

        def __init__(self, life: RunLifecycle[_JobState], lease: AsyncLease) -> None:
            self.life, self.lease = life, lease
            self.handed = False
            life.run = cast(Run, self)
            life.hold()

        def handed_over(self) -> None:
            self.handed = True
            self.life.finish()

    async def scenario() -> None:
        state = _JobState(job)
        state.settle()
        assert ready(state)
        async with multilock.connect_async(url) as locker:
            lease = await locker.try_acquire("job")
            assert lease is not None
            first = RunLifecycle(job, at(10), state)
            state.claim(first)
            assert not ready(state)  # claimed: its body is to come
            assert running(state)
            first.acquire()
            first.start()
            assert not ready(state)  # the body runs
            assert running(state)
            holder = Holder(first, lease)  # the hold phase
            assert ready(state)
            assert not running(state)
            assert state.holding is lease
            changed = state.changed()
            second = RunLifecycle(job, at(20), state)
            assert state.take_hold(second) is lease
            assert changed.done()  # the old hold is woken, and finds the lease gone
            assert holder.handed
            assert first.state is RunState.DONE
            assert state.current is second
            assert not ready(state)  # the next tick's run is under way
            assert running(state)
            assert state.take_hold(RunLifecycle(job, at(30), state)) is None  # nothing left
            second.start()
            Holder(second, lease)
            AsyncMemoryLocker(LockURL.parse(url)).revoke("job")
            assert not ready(state)  # a lost lease is not handed over: wait for its run to end
            assert state.take_hold(RunLifecycle(job, at(30), state)) is None
            assert state.holding is lease
            assert state.current is second
            state.settle(first)  # an older tick's settling leaves the current one be
            assert state.current is second
            state.settle(second)
            assert ready(state)
            assert state.holding is None

    asyncio.run(scenario())


def test_registration_refuses_duplicates_and_colliding_keys(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sched = Scheduler(namespace(), clock=manual(), metrics=False)

    sched.add_job(nothing, every(minutes=1), name="a")
    with pytest.raises(ConfigurationError, match="a job named 'a' is already registered"):
        sched.add_job(nothing, every(minutes=1), name="a")
    # FNV-1a 64 collisions are too rare to find here: make every name collide.
    monkeypatch.setattr(multilock._scheduling.scheduler, "advisory_key", lambda name: 42)
    other = Scheduler(namespace(), clock=manual(), metrics=False)
    other.add_job(nothing, every(minutes=1), name="first")
    with pytest.raises(ConfigurationError, match="'second' and 'first' have the same advisory key"):
        other.add_job(nothing, every(minutes=1), name="second")


def test_the_lock_argument() -> None:
    assert Scheduler(metrics=False).__repr__().startswith("<Scheduler file:///")
    with pytest.raises(ConfigurationError, match="takes a URL or a locker"):
        Scheduler(object(), metrics=False)  # type: ignore[arg-type]


def test_a_sync_locker_is_used_from_a_worker_thread() -> None:
    url, clock, events = namespace(), manual(), Events()
    tokens: list[int | None] = []

    async def job() -> None:
        tokens.append(current_run().fencing_token)

    with multilock.connect(url) as locker:

        async def scenario() -> None:
            sched = scheduler(locker, clock, events)
            sched.add_job(job, every(seconds=10), name="job")
            async with sched:
                clock.set(T0 + 10)
                # The run, not only the lease: the grant is taken on a worker thread and
                # read on the loop later; a clock moved on meanwhile makes it a late grant.
                await until(lambda: bool(events.of(EventKind.STARTED)), "the run starts")
                assert held_names(url) == ["job"]
                clock.set(T0 + 11)
                await until(lambda: held_names(url) == [], "the lease is released")

        asyncio.run(scenario())
        assert locker.try_acquire("still-open") is not None  # not closed by the scheduler
    assert events.fires(EventKind.SUCCEEDED) == [10]
    assert isinstance(tokens[0], int)


def test_a_sync_lockers_lost_lease_cancels_the_run() -> None:
    url, clock, events = namespace(), manual(), Events()
    outcome: list[str] = []

    async def guarded() -> None:
        outcome.append("began")
        await blocked(outcome)

    with multilock.connect(url) as locker:

        async def scenario() -> None:
            sched = scheduler(locker, clock, events)
            sched.add_job(guarded, every(seconds=60), name="guarded")
            async with sched:
                clock.set(T0 + 60)
                # The body itself says it runs: the lease is taken (in the sync locker's
                # thread) before the scheduler starts the run, and a loss landing in
                # between cancels the run before its body's first line (next test).
                await until(lambda: outcome == ["began"], "the body runs")
                AsyncMemoryLocker(LockURL.parse(url)).revoke("guarded", "connection killed")
                await until(lambda: outcome == ["began", "cancelled"], "the run is cancelled")

        asyncio.run(scenario())
    (lost,) = events.of(EventKind.LEASE_LOST)
    assert lost.reason == "connection killed"


def test_a_lease_lost_before_its_run_starts_is_reported_lost() -> None:
    """The loss lands between the grant and the run: the run is cancelled and reported
    ``lease_lost``, never as a success, and its body never gets past its first await."""
    url, clock, events = namespace(), manual(), Events()
    outcome: list[str] = []
    locker = CountingLocker(url)
    locker.lose_on_grant = "connection killed"

    async def guarded() -> None:
        outcome.append("began")
        await asyncio.sleep(0)
        outcome.append("finished")

    async def scenario() -> None:
        sched = scheduler(cast(multilock.AsyncDistributedLock, locker), clock, events)
        sched.add_job(guarded, every(seconds=60), name="guarded")
        async with sched:
            clock.set(T0 + 60)
            await settle()
            clock.set(T0 + 61)
            await settle()
            assert held_names(url) == []

    asyncio.run(scenario())
    assert "finished" not in outcome
    (lost,) = [e for e in events.seen if e.kind is not EventKind.STARTED]
    assert (lost.kind, lost.reason) == (EventKind.LEASE_LOST, "connection killed")


# --- several replicas ------------------------------------------------------------------------


async def _run_replicas(
    url: str,
    clock: ManualClock,
    offsets: Iterable[float],
    events: Events,
    *,
    until: float,
    interval: float = 1,
    job: Mapping[str, Any] | None = None,
    **options: Any,
) -> None:
    """Replicas with clocks ``offsets`` apart, each with job "job", walked to ``T0 + until``."""
    options.setdefault("skew_tolerance", 0.4)  # each clock within 400 ms of true time
    options.setdefault("misfire_grace", 0.15)  # the hold: 2 x 0.4 + 0.15 = 0.95 s
    options.setdefault("stop_timeout", 0.1)  # cancels the last lease holds at once
    replicas = []
    for i, offset in enumerate(offsets):
        sched = scheduler(url, clock.shifted(offset), events, replica_id=f"r{i}", **options)
        sched.add_job(nothing, every(seconds=interval), name="job", **(job or {}))
        replicas.append(sched)
        await sched.start()
    await _walk(clock, T0 + until)
    for sched in replicas:
        await sched.stop()


async def _walk(clock: ManualClock, until_t: float, step: float = 0.05) -> None:
    """Advance the clock in small steps, letting every replica react to each."""
    while clock.now() < until_t:
        clock.advance(step)
        await settle()


def _counts(events: Events) -> dict[float, int]:
    counted: dict[float, int] = {}
    for fire in events.fires(EventKind.STARTED):
        counted[round(fire, 3)] = counted.get(round(fire, 3), 0) + 1
    return counted


SKIPPED_HELD = EventKind.SKIPPED_HELD


def test_skewed_replicas_run_each_tick_exactly_once() -> None:
    """Clocks -300 ms, 0, +300 ms off true time (tolerance 400 ms), 1 s ticks: every tick
    once, the late ones skip."""
    url, clock, events = namespace(), manual(), Events()

    asyncio.run(_run_replicas(url, clock, (-0.3, 0.0, 0.3), events, until=12.5))
    assert _counts(events) == {float(t): 1 for t in range(1, 13)}
    skipped = Counter(
        round(e.fire_time.timestamp() - T0) for e in events.of(EventKind.SKIPPED_HELD)
    )
    # Tick 1 is 300 ms before the +300 ms replica's start, past its grace: not its to try.
    assert skipped == {1: 1} | dict.fromkeys(range(2, 13), 2)


def test_a_replica_later_than_the_tolerance_runs_the_tick_again() -> None:
    """The documented limit: skew beyond skew_tolerance is not covered. Clocks 600 ms
    apart, tolerance 200 ms: the winner's hold (2 x 0.2 + 0.1 = 0.5 s) is over when the
    late replica fires."""
    url, clock, events = namespace(), manual(), Events()

    late = _run_replicas(
        url, clock, (0.0, -0.6), events, until=3, interval=2, skew_tolerance=0.2, misfire_grace=0.1
    )
    asyncio.run(late)
    assert _counts(events) == {2.0: 2}


def test_local_jobs_run_on_every_replica() -> None:
    url, clock, events = namespace(), manual(), Events()

    everywhere = {"distributed": False}
    asyncio.run(_run_replicas(url, clock, (0.0, 0.0), events, until=3.5, job=everywhere))
    assert held_names(url) == []
    assert _counts(events) == {1.0: 2, 2.0: 2, 3.0: 2}


class CountingLocker:
    """memory:// with a count of the try_acquire_many calls (a real backend, observed),
    which can be made to answer like an unreachable server."""

    def __init__(self, url: str) -> None:
        self.inner = AsyncMemoryLocker(LockURL.parse(url))
        self.batches: list[list[str]] = []
        self.unavailable = False
        self.lose_on_grant: str | None = None  # a reason: every lease is lost as granted
        self.capabilities = self.inner.capabilities
        self.url = self.inner.url

    async def try_acquire(self, name: str, *, ttl: Any = None) -> AsyncLease | None:
        return await self.inner.try_acquire(name, ttl=ttl)

    async def try_acquire_many(
        self, names: Iterable[str], *, ttl: Any = None
    ) -> Mapping[str, AsyncLease | None]:
        names = list(names)
        self.batches.append(names)
        if self.unavailable:
            raise BackendUnavailable("connection refused")
        granted = await self.inner.try_acquire_many(names, ttl=ttl)
        if self.lose_on_grant is not None:
            for name, lease in granted.items():
                if lease is not None:
                    self.inner.revoke(name, self.lose_on_grant)
        return granted

    async def aclose(self) -> None:
        await self.inner.aclose()


def test_jobs_due_together_are_locked_in_one_batch() -> None:
    url, clock = namespace(), manual()
    locker = CountingLocker(url)

    async def scenario() -> None:
        sched = Scheduler(locker, clock=clock, metrics=False, stop_timeout=2)  # type: ignore[arg-type]
        for i in range(5):
            sched.add_job(nothing, every(seconds=10), name=f"job-{i}")
        async with sched:
            clock.set(T0 + 10)
            await settle()
            clock.set(T0 + 11)
            await settle()
        assert not locker.inner.closed  # the scheduler does not close a locker it was given

    asyncio.run(scenario())
    assert locker.batches == [[f"job-{i}" for i in range(5)]]


def test_an_unreachable_backend_misses_the_tick_not_the_scheduler() -> None:
    url, clock, events = namespace(), manual(), Events()
    locker = CountingLocker(url)

    async def scenario() -> None:
        sched = Scheduler(locker, clock=clock, metrics=False, stop_timeout=2)  # type: ignore[arg-type]
        sched.add_listener(events)
        sched.add_job(nothing, every(seconds=10), name="job")
        async with sched:
            locker.unavailable = True
            clock.set(T0 + 10)
            await settle()
            locker.unavailable = False
            clock.set(T0 + 20)
            await settle()
            clock.set(T0 + 21)
            await settle()

    asyncio.run(scenario())
    (missed,) = events.of(EventKind.MISSED)
    assert missed.fire_time == at(10)
    assert isinstance(missed.error, BackendUnavailable)
    assert missed.reason == "backend unavailable: connection refused"
    assert events.of(EventKind.FAILED) == []
    assert events.fires(EventKind.SUCCEEDED) == [20]


def test_calendar_jobs_follow_the_dst_policy_in_the_scheduler() -> None:
    """Europe/Kyiv, 29 March 2026: a 03:30 job runs once, at 04:00 EEST (01:00 UTC)."""
    url, events = namespace(), Events()
    clock = ManualClock(datetime(2026, 3, 28, 22, tzinfo=UTC).timestamp())
    ran: list[datetime] = []

    async def scenario() -> None:
        sched = scheduler(url, clock, events, timezone="Europe/Kyiv")

        @sched.job(multilock.cron("30 3 * * *"), name="nightly")
        async def nightly() -> None:
            ran.append(current_run().fire_time)

        async with sched:
            for hour in range(1, 6):
                clock.set(datetime(2026, 3, 29, hour, tzinfo=UTC).timestamp())
                await settle()

    asyncio.run(scenario())
    assert ran == [datetime(2026, 3, 29, 1, tzinfo=UTC)]


def test_metrics_are_off_without_prometheus_client(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import now fails
    url, clock, events = namespace(), manual(), Events()

    async def scenario() -> None:
        sched = Scheduler(url, clock=clock, stop_timeout=2)  # metrics on by default
        sched.add_listener(events)
        sched.add_job(nothing, every(seconds=10), name="job")
        async with sched:
            clock.set(T0 + 10)
            await settle()
            clock.set(T0 + 11)
            await settle()

    asyncio.run(scenario())
    assert events.fires(EventKind.SUCCEEDED) == [10]


# --- leader mode -----------------------------------------------------------------------------


def test_leader_mode_runs_on_the_leader_and_fails_over() -> None:
    url, clock, events = namespace(), manual(), Events()
    ran_on: list[str] = []
    cancelled: list[str] = []

    async def job() -> None:
        ran_on.append(current_run().replica_id)
        if len(ran_on) == 1:  # the first run is still going when leadership goes
            await blocked(cancelled, current_run().replica_id)

    async def scenario() -> None:
        a, b = (
            scheduler(url, clock, events, replica_id=r, coordination="leader", stop_timeout=0.1)
            for r in ("r0", "r1")
        )
        for sched in (a, b):
            sched.add_job(job, every(seconds=10), name="job")
        await a.start()
        await settle()
        await b.start()
        await _walk(clock, T0 + 10.5)
        assert (a.is_leader, b.is_leader) == (True, False)
        assert ran_on == ["r0"]
        AsyncMemoryLocker(LockURL.parse(url)).revoke("multilock-scheduler-leader", "expired")
        await settle()
        assert cancelled == ["r0"]
        assert not a.is_leader
        await a.stop()  # a crashes; b polls every leader_poll (1 s)
        await _walk(clock, T0 + 12)
        assert b.is_leader
        await _walk(clock, T0 + 20.5)
        await b.stop()
        assert held_names(url) == []

    asyncio.run(scenario())
    assert ran_on == ["r0", "r1"]
    assert [e.replica_id for e in events.of(EventKind.LEASE_LOST)] == ["r0"]
    assert {e.reason for e in events.of(EventKind.SKIPPED_HELD)} == {"not the leader"}


# --- lifecycle -------------------------------------------------------------------------------


def test_shutdown_waits_for_running_jobs_then_cancels_and_releases() -> None:
    url, clock, events = namespace(), manual(), Events()
    finished: list[str] = []

    async def quick() -> None:
        await asyncio.sleep(0.05)
        finished.append("quick")

    async def scenario() -> None:
        sched = scheduler(url, clock, events, stop_timeout=0.3)
        sched.add_job(quick, every(seconds=10), name="quick")
        sched.add_job(blocked, every(seconds=10), name="stuck", args=(finished, "stuck cancelled"))
        await sched.start()
        clock.set(T0 + 10)
        await settle()
        assert set(held_names(url)) == {"quick", "stuck"}
        began = time.monotonic()
        await sched.stop()
        assert 0.25 < time.monotonic() - began < 2
        assert held_names(url) == []

    asyncio.run(scenario())
    assert finished == ["quick", "stuck cancelled"]
    assert events.fires(EventKind.SUCCEEDED) == [10]


def test_a_stopped_scheduler_starts_again() -> None:
    url, clock, events = namespace(), manual(), Events()

    async def scenario() -> None:
        sched = scheduler(url, clock, events)
        sched.add_job(nothing, every(seconds=10), name="job")
        for tick in (10, 20):
            async with sched:
                clock.set(T0 + tick)
                await settle()
                clock.set(T0 + tick + 1)
                await settle()

    asyncio.run(scenario())
    assert events.fires(EventKind.SUCCEEDED) == [10, 20]


def test_background_thread_for_sync_applications() -> None:
    url = namespace()
    runs: list[float] = []
    sched = Scheduler(url, skew_tolerance=0.04, metrics=False)
    sched.add_job(lambda: runs.append(time.time()), every(seconds=0.1), name="fast")
    sched.start_in_background()
    try:
        poll("three runs", lambda: len(runs) >= 3, 5)
    finally:
        sched.shutdown()
    assert not any(t.name == "multilock-scheduler" for t in threading.enumerate())


def test_run_stops_gracefully_on_sigterm(tmp_path: Any) -> None:
    script = textwrap.dedent(
        f"""
        import logging
        import multilock
        logging.basicConfig(level=logging.INFO)
        sched = multilock.Scheduler("file://{tmp_path}", metrics=False)
        sched.add_job(lambda: None, multilock.every(minutes=1), name="idle")
        sched.run()
        print("stopped", flush=True)
        """
    )
    with subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        assert proc.stderr is not None
        # run() installs its signal handlers before it starts, and start logs this line.
        line = proc.stderr.readline()
        assert "scheduler started" in line, line
        proc.terminate()
        out, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    assert out.strip() == "stopped"
    assert "scheduler stopped" in err


def test_skipped_held_is_logged_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    url, clock, events = namespace(), manual(), Events()

    with caplog.at_level(logging.DEBUG, logger="multilock.scheduler"):
        asyncio.run(_run_replicas(url, clock, (0.0, -0.1), events, until=2.5))
    skipped = [r for r in caplog.records if getattr(r, "outcome", None) == "skipped_held"]
    assert skipped
    assert {r.levelno for r in skipped} == {logging.DEBUG}
    assert {r.replica_id for r in skipped} == {"r1"}  # type: ignore[attr-defined]
    assert [r.fire_time for r in skipped] == [at(1).isoformat(), at(2).isoformat()]  # type: ignore[attr-defined]


# --- run_now: one run outside the schedule, under the job's lock ------------------------


def test_run_now_runs_once_under_the_lock_and_says_how_it_went() -> None:
    url, clock, events = namespace(), manual(), Events()
    seen: list[tuple[datetime, int | None]] = []

    async def job() -> None:
        run = current_run()
        seen.append((run.fire_time, run.fencing_token))

    async def failing() -> None:
        raise RuntimeError("boom")

    async def scenario() -> None:
        sched = scheduler(url, clock, events)
        sched.add_job(job, every(hours=1), name="hourly")
        sched.add_job(failing, every(hours=1), name="failing")
        async with sched:
            assert await sched.run_now("hourly") is EventKind.SUCCEEDED
            assert await sched.run_now("failing") is EventKind.FAILED
            other = multilock.connect_async(url)
            async with other:
                held = await other.try_acquire("elsewhere")
                assert held is not None
                sched.add_job(job, every(hours=1), name="elsewhere")
                assert await sched.run_now("elsewhere") is EventKind.SKIPPED_HELD
            with pytest.raises(KeyError, match="no job named 'nope'"):
                await sched.run_now("nope")

    asyncio.run(scenario())
    assert seen == [(at(1), seen[0][1])]  # the call's moment by the scheduler's clock
    assert [e.job for e in events.of(EventKind.STARTED)] == ["hourly", "failing"]


def test_an_async_body_runs_in_a_task_named_after_its_job() -> None:
    url, clock, events = namespace(), manual(), Events()
    names: list[str] = []

    async def job() -> None:
        task = asyncio.current_task()
        assert task is not None
        names.append(task.get_name())

    async def scenario() -> None:
        sched = scheduler(url, clock, events)
        sched.add_job(job, every(seconds=10), name="reports.nightly")
        async with sched:
            clock.set(T0 + 10)
            await until(lambda: bool(events.of(EventKind.SUCCEEDED)), "the tick ran")
            assert await sched.run_now("reports.nightly") is EventKind.SUCCEEDED
        assert names == ["reports.nightly", "reports.nightly"]

    asyncio.run(scenario())


def test_run_now_right_after_a_tick_runs_under_the_lease_the_tick_still_holds() -> None:
    url, clock, events = namespace(), manual(), Events()

    async def scenario() -> None:
        sched = scheduler(url, clock, events)
        sched.add_job(nothing, every(seconds=10), name="job")
        async with sched:
            clock.set(T0 + 10)
            await until(lambda: bool(events.of(EventKind.SUCCEEDED)), "the tick ran")
            assert held_names(url) == ["job"]  # its hold lasts past the run
            assert await sched.run_now("job") is EventKind.SUCCEEDED

    asyncio.run(scenario())
    assert [e.fire_time for e in events.of(EventKind.SUCCEEDED)] == [at(10), at(10)]


def test_run_now_of_a_running_job_is_an_overlap_and_a_stop_ends_the_wait() -> None:
    url, clock, events = namespace(), manual(), Events()
    record: list[str] = []

    async def scenario() -> None:
        sched = scheduler(url, clock, events, stop_timeout=0.1)
        sched.add_job(blocked, every(hours=1), name="long", args=(record,))
        await sched.start()
        first = asyncio.ensure_future(sched.run_now("long"))
        await until(lambda: bool(events.of(EventKind.STARTED)), "the first run starts")
        assert await sched.run_now("long") is EventKind.SKIPPED_OVERLAP
        await sched.stop()
        (outcome,) = await asyncio.gather(first, return_exceptions=True)
        assert isinstance(outcome, RuntimeError), outcome  # its run was cancelled by stop()
        assert "the scheduler stopped before the run ended" in str(outcome)

    asyncio.run(scenario())
    assert record == ["cancelled"]
