"""The scheduler as an operator meets it: a backend checked at start (refused, or waited
for), an outage reported once and counted, readiness and liveness, sync jobs on a pool
of their own whose crowding shows, and the exact log lines of each path."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import pytest

import multilock
from multilock import EventKind, JobEvent, ManualClock, Scheduler, every, once
from multilock._cli._http import Endpoints, serve
from multilock._locks.memory import AsyncMemoryLocker
from multilock._scheduling.scheduler import PROBE_NAME
from multilock.abc import AsyncLease
from multilock.backend import LockURL
from multilock.errors import BackendUnavailable
from multilock.testing import poll

T0 = 1_800_000_000.0
REFUSED = "connection refused"


def namespace() -> str:
    """A fresh memory:// URL."""
    return f"memory://ops-{uuid.uuid4().hex[:10]}"


async def settle(rounds: int = 50) -> None:
    """Let every ready callback and task run (memory:// and a manual clock do no I/O)."""
    for _ in range(rounds):
        await asyncio.sleep(0)


class Switchable:
    """memory:// that can be made to answer like an unreachable server (``down``)."""

    def __init__(self, url: str) -> None:
        self.inner = AsyncMemoryLocker(LockURL.parse(url))
        self.down = False
        self.capabilities = self.inner.capabilities
        self.url = self.inner.url
        self.probes = 0

    def _check(self) -> None:
        if self.down:
            raise BackendUnavailable(REFUSED)

    async def try_acquire(self, name: str, *, ttl: Any = None) -> AsyncLease | None:
        self.probes += name == PROBE_NAME
        self._check()
        return await self.inner.try_acquire(name, ttl=ttl)

    async def try_acquire_many(
        self, names: Iterable[str], *, ttl: Any = None
    ) -> Mapping[str, AsyncLease | None]:
        self._check()
        return await self.inner.try_acquire_many(names, ttl=ttl)

    async def aclose(self) -> None:
        await self.inner.aclose()


class Events:
    """A listener keeping every event."""

    def __init__(self) -> None:
        self.seen: list[JobEvent] = []

    def __call__(self, event: JobEvent) -> None:
        self.seen.append(event)

    def of(self, kind: EventKind) -> list[JobEvent]:
        return [e for e in self.seen if e.kind is kind]


@contextmanager
def records(level: int = logging.INFO) -> Iterator[list[logging.LogRecord]]:
    """The records of the ``multilock`` loggers from ``level`` up, but the scheduler's
    started/stopped lines."""
    kept: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if not record.getMessage().startswith(("scheduler started", "scheduler stopped")):
                kept.append(record)

    handler, logger = Keep(level), logging.getLogger("multilock")
    old = logger.level
    logger.addHandler(handler)
    logger.setLevel(level)
    try:
        yield kept
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)


def lines(kept: list[logging.LogRecord]) -> list[tuple[str, str]]:
    """(level, message) of each record."""
    return [(r.levelname, r.getMessage()) for r in kept]


async def nothing() -> None:
    """A job that does nothing."""


# --- the backend at start ---------------------------------------------------------------------


def test_an_unreachable_backend_refuses_the_start_with_one_line() -> None:
    locker = Switchable(namespace())
    locker.down = True
    sched = Scheduler(locker, clock=ManualClock(T0), metrics=False)  # type: ignore[arg-type]
    sched.add_job(nothing, every(seconds=10), name="job")

    async def scenario() -> None:
        with pytest.raises(BackendUnavailable) as info:
            await sched.start()
        assert str(info.value) == f"the scheduler cannot start: {REFUSED}"
        assert sched.readiness() == (False, "the scheduler is not running")
        locker.down = False
        async with sched:  # the same scheduler starts once the backend answers
            assert sched.readiness() == (True, "ready")

    with records() as kept:
        asyncio.run(scenario())
    assert kept == []  # the caller reports the refusal: the scheduler logs nothing


def test_wait_for_backend_retries_with_backoff_logging_each_attempt_once() -> None:
    locker, clock = Switchable(namespace()), ManualClock(T0)
    locker.down = True
    sched = Scheduler(locker, clock=clock, metrics=False, wait_for_backend="10s")  # type: ignore[arg-type]

    async def scenario() -> None:
        starting = asyncio.ensure_future(sched.start())
        for pause in (0.5, 1.0, 2.0):  # the backoff doubles
            await settle()
            assert not starting.done()
            clock.advance(pause)
        locker.down = False
        await settle()
        assert starting.done()
        await starting
        await sched.stop()

    with records() as kept:
        asyncio.run(scenario())
    assert locker.probes == 4
    assert lines(kept) == [
        (
            "WARNING",
            f"backend unreachable at start (attempt 1, next in 0.5s, 10.0s left): {REFUSED}",
        ),
        (
            "WARNING",
            f"backend unreachable at start (attempt 2, next in 1.0s, 9.5s left): {REFUSED}",
        ),
        (
            "WARNING",
            f"backend unreachable at start (attempt 3, next in 2.0s, 8.5s left): {REFUSED}",
        ),
        ("INFO", "backend answered at attempt 4"),
    ]


def test_wait_for_backend_gives_up_once_spent() -> None:
    locker, clock = Switchable(namespace()), ManualClock(T0)
    locker.down = True
    sched = Scheduler(locker, clock=clock, metrics=False, wait_for_backend=2)  # type: ignore[arg-type]

    async def scenario() -> None:
        starting = asyncio.ensure_future(sched.start())
        for pause in (0.5, 1.0, 0.5):  # the last pause is what is left
            await settle()
            clock.advance(pause)
        await settle()
        with pytest.raises(BackendUnavailable) as info:
            await starting
        assert str(info.value) == f"the scheduler cannot start after 4 attempts in 2.0s: {REFUSED}"

    with records() as kept:
        asyncio.run(scenario())
    assert [level for level, _ in lines(kept)] == ["WARNING"] * 3


# --- an outage while running --------------------------------------------------------------------


def test_an_outage_at_ticks_is_one_warning_then_counts_and_missed_runs() -> None:
    prometheus = pytest.importorskip("prometheus_client")
    registry = prometheus.CollectorRegistry()
    locker, clock, events = Switchable(namespace()), ManualClock(T0 + 1), Events()
    sched = Scheduler(locker, clock=clock, registry=registry, probe_interval=None, stop_timeout=2)  # type: ignore[arg-type]
    sched.add_listener(events)
    for i in range(3):
        sched.add_job(nothing, every(seconds=10), name=f"job-{i}")

    async def scenario() -> None:
        async with sched:
            locker.down = True
            for tick in range(10, 80, 10):  # 7 ticks of 3 jobs while down
                clock.set(T0 + tick)
                await settle()
                assert sched.readiness() == (False, f"backend unreachable: {REFUSED}")
            locker.down = False
            clock.set(T0 + 80)
            await settle()
            clock.set(T0 + 81)
            await settle()
            assert sched.readiness() == (True, "ready")

    with records() as kept:
        asyncio.run(scenario())
    missed = events.of(EventKind.MISSED)
    assert len(missed) == 21
    assert all(isinstance(e.error, BackendUnavailable) for e in missed)
    assert {e.reason for e in missed} == {f"backend unavailable: {REFUSED}"}
    assert len(events.of(EventKind.SUCCEEDED)) == 3
    first, going_on, over = kept[0], kept[1], kept[2]
    fire = datetime.fromtimestamp(T0 + 10, UTC).isoformat()
    assert lines(kept[:1]) == [
        ("WARNING", f"job job-0 tick {fire} missed (backend unavailable: {REFUSED})")
    ]
    assert first.exc_info is None  # no traceback for an expected error
    assert (first.job, first.outcome) == ("job-0", "missed")  # type: ignore[attr-defined]
    assert lines([going_on]) == [
        ("WARNING", f"still going on after 60.0s, 18 more ticks missed: {REFUSED}")
    ]
    assert lines([over]) == [
        ("INFO", f"backend reachable again after 70.0s, 2 more ticks missed: {REFUSED}")
    ]
    assert [r.levelname for r in kept[3:]] == ["INFO"] * 3  # the three successes
    value = registry.get_sample_value
    for i in range(3):
        job = {"job": f"job-{i}"}
        assert value("multilock_job_runs_total", {**job, "outcome": "missed"}) == 7
        assert value("multilock_job_missed_total", {**job, "cause": "backend_unavailable"}) == 7


def probing(locker: Switchable) -> tuple[ManualClock, Scheduler]:
    """A scheduler of one hourly job on ``locker``, probing it every 10 s of a manual clock."""
    clock = ManualClock(T0 + 1)
    sched = Scheduler(locker, clock=clock, metrics=False, probe_interval=10)  # type: ignore[arg-type]
    sched.add_job(nothing, every(hours=1), name="hourly")
    return clock, sched


def test_an_outage_between_ticks_is_found_by_the_probe() -> None:
    locker = Switchable(namespace())
    clock, sched = probing(locker)

    async def scenario() -> None:
        async with sched:
            assert sched.readiness() == (True, "ready")
            locker.down = True
            for _ in range(4):
                clock.advance(10)
                await settle()
                assert sched.readiness() == (False, f"backend unreachable: {REFUSED}")
            locker.down = False
            clock.advance(10)
            await settle()
            assert sched.readiness() == (True, "ready")

    with records() as kept:
        asyncio.run(scenario())
    assert lines(kept) == [
        ("WARNING", f"backend unreachable: {REFUSED}"),
        ("INFO", f"backend reachable again after 40.0s, 3 more probes failed: {REFUSED}"),
    ]
    assert locker.probes == 6  # at start, then every 10 s


class Stalling(Switchable):
    """memory:// whose probe waits for ``answer`` (a server slow to answer)."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.answer = asyncio.Event()
        self.asked = asyncio.Event()

    async def try_acquire(self, name: str, *, ttl: Any = None) -> AsyncLease | None:
        if name == PROBE_NAME and self.probes:  # the start's probe answers at once
            self.asked.set()
            await self.answer.wait()
        return await super().try_acquire(name, ttl=ttl)


def test_a_probe_still_waiting_at_stop_reports_no_outage() -> None:
    locker = Stalling(namespace())
    clock, sched = probing(locker)

    async def scenario() -> None:
        async with sched:
            clock.advance(10)
            await asyncio.wait_for(locker.asked.wait(), 5)

    with records() as kept:
        asyncio.run(scenario())
    assert lines(kept) == []  # stopping is not an outage


def test_a_lost_lease_is_one_error_line() -> None:
    url, clock, events = namespace(), ManualClock(T0 + 1), Events()
    sched = Scheduler(url, clock=clock, metrics=False, stop_timeout=2)
    sched.add_listener(events)
    blocked = asyncio.Event

    async def guarded() -> None:
        await blocked().wait()

    sched.add_job(guarded, every(seconds=60), name="guarded")

    async def scenario() -> None:
        async with sched:
            clock.set(T0 + 60)
            await settle()
            AsyncMemoryLocker(LockURL.parse(url)).revoke("guarded", "connection killed")
            await settle()

    with records() as kept:
        asyncio.run(scenario())
    fire = datetime.fromtimestamp(T0 + 60, UTC).isoformat()
    assert lines(kept) == [
        ("ERROR", f"job guarded tick {fire} lease_lost in 0.000s (connection killed)")
    ]
    assert kept[0].exc_info is None


# --- health over HTTP ---------------------------------------------------------------------------


def get(url: str) -> tuple[int, str]:
    """Status and body of a GET."""
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_healthz_and_readyz() -> None:
    locker = Switchable(namespace())
    sched = Scheduler(locker, metrics=False, probe_interval=0.1, stop_timeout=5)  # type: ignore[arg-type]

    hogging, hogs = threading.Event(), threading.Event()

    async def hog() -> None:
        if hogging.is_set():
            hogs.set()
            time.sleep(2.5)  # blocks the event loop: what /healthz is for  # noqa: ASYNC251

    sched.add_job(hog, every(seconds=1), name="hog", distributed=False)
    endpoints = Endpoints(sched)
    endpoints.add_health()
    server = serve(endpoints, "127.0.0.1", 0, "health checks")
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert get(f"{base}/healthz") == (503, "the scheduler is not running\n")
        assert get(f"{base}/readyz") == (503, "the scheduler is not running\n")
        sched.start_in_background()
        try:
            assert get(f"{base}/healthz") == (200, "alive\n")
            assert get(f"{base}/readyz") == (200, "ready\n")
            locker.down = True
            poll("/readyz says not ready", lambda: get(f"{base}/readyz")[0] == 503, 15)
            assert get(f"{base}/readyz") == (503, f"backend unreachable: {REFUSED}\n")
            assert get(f"{base}/healthz") == (200, "alive\n")  # alive, only not ready
            locker.down = False
            poll("/readyz ready again", lambda: get(f"{base}/readyz")[0] == 200, 15)
            assert get(f"{base}/nope")[0] == 404
            hogging.set()
            assert hogs.wait(10)
            assert get(f"{base}/healthz") == (
                503,
                "the scheduler's event loop did not answer within 1s\n",
            )
        finally:
            sched.shutdown()
    finally:
        server.shutdown()
        server.server_close()


# --- sync jobs on the scheduler's own pool ----------------------------------------------------


def test_sync_jobs_run_on_the_schedulers_pool_and_a_crowd_is_visible() -> None:
    prometheus = pytest.importorskip("prometheus_client")
    registry = prometheus.CollectorRegistry()
    events = Events()
    sched = Scheduler(
        namespace(), registry=registry, max_workers=2, stop_timeout=10, probe_interval=None
    )
    sched.add_listener(events)
    threads: dict[str, str] = {}
    starts: dict[str, float] = {}

    def body(name: str, seconds: float) -> None:
        threads[name] = threading.current_thread().name
        starts[name] = time.time()
        time.sleep(seconds)

    fire = datetime.fromtimestamp(time.time() // 1 + 3, UTC)  # after the start, even when slow
    # Four sync jobs due together, two threads: two wait for the first two to end. The
    # last one's 0.5 s timeout counts from its real start (timed from the tick, it would
    # be past it before it started).
    for name, seconds, timeout in [
        ("a", 0.4, None),
        ("b", 0.4, None),
        ("c", 0.2, None),
        ("d", 0.2, 0.5),
    ]:
        sched.add_job(body, once(at=fire), name=name, args=(name, seconds), timeout=timeout)

    with records(logging.WARNING) as kept:
        sched.start_in_background()
        try:
            poll("four runs succeeded", lambda: len(events.of(EventKind.SUCCEEDED)) == 4, 20)
        finally:
            sched.shutdown()
    assert all(name.startswith("multilock-job") for name in threads.values()), threads
    assert all(e.delay is not None for e in events.of(EventKind.STARTED))
    started = {e.job: e.delay or 0.0 for e in events.of(EventKind.STARTED)}
    assert started.keys() == {"a", "b", "c", "d"}
    first, waited = sorted(started, key=lambda job: started[job])[:2], ["c", "d"]
    assert sorted(first) == ["a", "b"]
    for job in waited:  # reported when they really began, after a worker freed up
        assert started[job] >= 0.35, started
        assert abs(starts[job] - (fire.timestamp() + started[job])) < 0.1
    assert [r.getMessage() for r in kept] == [
        f"job {kept[0].job} tick {fire.isoformat()} waits for a worker thread: all 2 are busy"  # type: ignore[attr-defined]
        " (raise the scheduler's max_workers)"
    ]
    waits = [
        registry.get_sample_value("multilock_job_worker_waits_total", {"job": j}) for j in "abcd"
    ]
    assert sorted(w or 0 for w in waits) == [0, 0, 1, 1]


def test_max_workers_is_checked() -> None:
    for bad in (0, -1, 1.5, True):
        with pytest.raises(multilock.errors.ConfigurationError, match="max_workers"):
            Scheduler("memory://x", max_workers=bad)  # type: ignore[arg-type]
    assert Scheduler("memory://x", metrics=False).max_workers == 32


# --- the lost path on a real server -------------------------------------------------------------


def _advisory_holder(postgres_url: str, name: str) -> int | None:
    """The server pid holding ``name``'s advisory lock, if any."""
    psycopg = pytest.importorskip("psycopg")
    from multilock_postgres._config import parse_settings

    key = multilock.advisory_key(name) & 0xFFFFFFFFFFFFFFFF
    settings = parse_settings(LockURL.parse(postgres_url))
    with psycopg.connect(settings.conninfo, **settings.connect_kwargs()) as conn:
        row = conn.execute(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND classid = %s::bigint::oid AND objid = %s::bigint::oid AND objsubid = 1",
            (key >> 32, key & 0xFFFFFFFF),
        ).fetchone()
        return None if row is None else int(row[0])


def test_a_session_ended_by_the_server_is_one_error_line(postgres_url: str) -> None:
    from multilock_postgres._backend import terminate

    events, name = Events(), f"ops-lost-{uuid.uuid4().hex[:8]}"
    sched = Scheduler(postgres_url, metrics=False, stop_timeout=5, probe_interval=0.2)
    sched.add_listener(events)
    running = threading.Event()

    async def guarded() -> None:
        if not running.is_set():  # the first run waits to be cut off; later ones return
            running.set()
            await asyncio.sleep(30)

    sched.add_job(guarded, every(seconds=1), name=name)
    with records() as kept:
        sched.start_in_background()
        try:
            assert running.wait(10)
            pid = poll("the lock is held", lambda: _advisory_holder(postgres_url, name), 15)
            assert terminate(LockURL.parse(postgres_url), pid)
            poll("lease_lost", lambda: events.of(EventKind.LEASE_LOST), 20)
            succeeded = len(events.of(EventKind.SUCCEEDED))
            # The probes and ticks that follow add nothing at WARNING or above.
            poll("2 more runs", lambda: len(events.of(EventKind.SUCCEEDED)) >= succeeded + 2, 15)
        finally:
            sched.shutdown()
    loud = [(level, text) for level, text in lines(kept) if level in ("WARNING", "ERROR")]
    assert len(loud) == 1, loud
    assert loud[0][0] == "ERROR"
    assert f"job {name} tick " in loud[0][1]
    assert " lease_lost " in loud[0][1]


# --- the bad-input path ---------------------------------------------------------------------------


def test_bad_input_raises_and_logs_nothing() -> None:
    bad: list[Any] = [
        lambda: Scheduler("redis://:pw@h:notaport/0"),
        lambda: Scheduler("memory://x", wait_for_backend="forever"),
        lambda: Scheduler("memory://x", probe_interval=0),
        lambda: Scheduler("memory://x", metrics=False).add_job(
            nothing, every(seconds=10), timeout="x"
        ),
    ]
    with records(logging.DEBUG) as kept:
        for make in bad:
            with pytest.raises(multilock.errors.ConfigurationError) as info:
                make()
            assert "\n" not in str(info.value)
    assert kept == []


class Refusing(Switchable):
    """memory:// whose batch acquire refuses every name as bad input, as a backend with
    a lower name limit would."""

    async def try_acquire_many(
        self, names: Iterable[str], *, ttl: Any = None
    ) -> Mapping[str, AsyncLease | None]:
        raise multilock.errors.InvalidLockName("lock name of 9 bytes is too long for x://")


def test_a_lock_refused_as_bad_input_is_one_error_line_a_tick_without_traceback() -> None:
    locker, clock, events = Refusing(namespace()), ManualClock(T0 + 1), Events()
    sched = Scheduler(locker, clock=clock, metrics=False, probe_interval=None)  # type: ignore[arg-type]
    sched.add_listener(events)
    sched.add_job(nothing, every(seconds=10), name="job")

    async def scenario() -> None:
        async with sched:
            for tick in (10, 20):
                clock.set(T0 + tick)
                await settle()

    with records() as kept:
        asyncio.run(scenario())
    refused = "lock refused: lock name of 9 bytes is too long for x://"
    assert [e.reason for e in events.of(EventKind.FAILED)] == [refused, refused]
    assert [(r.levelname, r.exc_info) for r in kept] == [("ERROR", None), ("ERROR", None)]
    assert kept[0].getMessage().endswith(f" failed ({refused})")
