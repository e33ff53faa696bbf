"""ShedLock's semantics: ``locker.hold(name, at_least=..., at_most=...)``, the function form
``multilock.hold`` for lockers not built on the kit, and ``@multilock.once_per_tick``,
sync and async, on memory://, file://, PostgreSQL and Redis."""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import Self

import pytest

import multilock
from multilock._scheduling.ticks import check_hold, latest_start, parse_tick, tick_of
from multilock.abc import AsyncDistributedLock, AsyncLease, Capability, DistributedLock, Lease
from multilock.backend import AsyncLockerBase, LockerBase
from multilock.errors import ConfigurationError
from multilock.testing import apoll, poll

BACKENDS = ("memory", "file", "postgres", "redis")
AT_LEAST = 0.8
SLACK = 2.0  # how much later than due a background release may come on a loaded machine


@pytest.fixture(params=BACKENDS)
def url(request: pytest.FixtureRequest) -> str:
    """A reachable URL of each backend (skipped, or failed when required, if down)."""
    value: str = request.getfixturevalue(f"{request.param}_url")
    return value


def name() -> str:
    return f"hold-{uuid.uuid4().hex[:10]}"


def kit(locker: DistributedLock) -> LockerBase:
    """``locker``, seen as what it is: the kit's base gives it ``hold()`` (the protocol,
    which third-party lockers need not extend, does not: ``multilock.hold`` is its form)."""
    assert isinstance(locker, LockerBase)
    return locker


def akit(locker: AsyncDistributedLock) -> AsyncLockerBase:
    """The async :func:`kit`."""
    assert isinstance(locker, AsyncLockerBase)
    return locker


# --- hold, sync ---------------------------------------------------------------------------


def test_hold_keeps_the_lease_at_least_then_releases_it(url: str) -> None:
    """The block ends at once; the lock stays held until at_least, then is free."""
    lock = name()
    with multilock.connect(url) as mine, multilock.connect(url) as other:
        began = time.time()
        with kit(mine).hold(lock, at_least=AT_LEAST) as lease:
            assert lease is not None
            assert other.try_acquire(lock) is None
        assert time.time() - began < AT_LEAST / 2, "the block must not wait for the hold"
        assert other.try_acquire(lock) is None, "released before at_least"
        taken = poll(
            "the lock free after at_least", lambda: other.try_acquire(lock), AT_LEAST + SLACK
        )
        assert time.time() - began >= AT_LEAST
        taken.release()


def test_hold_past_at_least_releases_at_the_end_of_the_block(url: str) -> None:
    lock = name()
    with multilock.connect(url) as mine, multilock.connect(url) as other:
        with kit(mine).hold(lock, at_least=0.2) as lease:
            assert lease is not None
            time.sleep(0.3)  # the body outlasts at_least: the work being held, not a wait
        taken = other.try_acquire(lock)
        assert taken is not None, "a hold whose at_least has passed is released at the block's end"
        taken.release()


def test_hold_of_a_lock_held_elsewhere_gives_none_and_leaves_it(url: str) -> None:
    lock = name()
    with multilock.connect(url) as mine, multilock.connect(url) as other:
        theirs = other.try_acquire(lock)
        assert theirs is not None
        with kit(mine).hold(lock, at_least=AT_LEAST) as lease:
            assert lease is None
        assert theirs.held
        theirs.release()
        again = mine.try_acquire(lock)
        assert again is not None
        again.release()


def test_hold_counts_at_least_from_since(url: str) -> None:
    """A tick 0.5 s ago with at_least 0.8 s: held for about 0.3 s more, not 0.8."""
    lock = name()
    with multilock.connect(url) as mine, multilock.connect(url) as other:
        since = time.time() - 0.5
        with kit(mine).hold(lock, at_least=AT_LEAST, since=since) as lease:
            assert lease is not None
        taken = poll("free at since + at_least", lambda: other.try_acquire(lock), AT_LEAST + SLACK)
        assert time.time() >= since + AT_LEAST
        taken.release()


def test_at_most_is_the_ttl_of_the_lease(redis_url: str) -> None:
    with multilock.connect(redis_url) as locker, kit(locker).hold(name(), at_most="7s") as lease:
        assert lease is not None
        assert Capability.TTL in locker.capabilities
        assert lease.expires_at is not None
        left = (lease.expires_at - datetime.now(UTC)).total_seconds()
        assert 5 < left <= 7


def test_bad_holds_are_refused_before_anything_is_asked(memory_url: str) -> None:
    with multilock.connect(memory_url) as locker:
        with pytest.raises(ConfigurationError, match=r"at_least .* is longer than at_most"):
            kit(locker).hold("x", at_least="10s", at_most="5s")
        with pytest.raises(ConfigurationError, match="invalid at_least"):
            kit(locker).hold("x", at_least="soon")
        with pytest.raises(ConfigurationError, match="has no timezone"):
            kit(locker).hold("x", since=datetime(2026, 1, 1))


# --- hold, async ----------------------------------------------------------------------------


def test_async_hold_keeps_the_lease_at_least_then_releases_it(url: str) -> None:
    async def scenario() -> None:
        lock = name()
        async with multilock.connect_async(url) as mine, multilock.connect_async(url) as other:
            began = time.time()
            async with akit(mine).hold(lock, at_least=AT_LEAST) as lease:
                assert lease is not None
                assert await other.try_acquire(lock) is None
            assert time.time() - began < AT_LEAST / 2
            assert await other.try_acquire(lock) is None, "released before at_least"
            taken = await apoll(
                "the lock free after at_least", lambda: other.try_acquire(lock), AT_LEAST + SLACK
            )
            assert time.time() - began >= AT_LEAST
            await taken.release()
            async with akit(mine).hold(lock, at_least=AT_LEAST) as lease:
                assert lease is not None
                async with akit(other).hold(lock) as none:
                    assert none is None

    asyncio.run(scenario())


def test_async_hold_past_at_least_releases_at_once(url: str) -> None:
    async def scenario() -> None:
        lock = name()
        async with multilock.connect_async(url) as mine, multilock.connect_async(url) as other:
            async with akit(mine).hold(lock, since=time.time() - 5, at_least=1) as lease:
                assert lease is not None
            taken = await other.try_acquire(lock)
            assert taken is not None
            await taken.release()

    asyncio.run(scenario())


# --- the function form, for a locker not built on the kit --------------------------------


class Delegating:
    """A sync locker of its own (no kit base class): the contract, by delegation."""

    def __init__(self, inner: DistributedLock) -> None:
        self.inner = inner

    @property
    def capabilities(self) -> frozenset[Capability]:
        return self.inner.capabilities

    @property
    def url(self) -> str:
        return self.inner.url

    def try_acquire(self, name: str, *, ttl: float | str | timedelta | None = None) -> Lease | None:
        return self.inner.try_acquire(name, ttl=ttl)

    def try_acquire_many(
        self, names: Iterable[str], *, ttl: float | str | timedelta | None = None
    ) -> Mapping[str, Lease | None]:
        return self.inner.try_acquire_many(names, ttl=ttl)

    def acquire(
        self,
        name: str,
        *,
        timeout: float | str | timedelta | None = None,
        ttl: float | str | timedelta | None = None,
    ) -> Lease:
        return self.inner.acquire(name, timeout=timeout, ttl=ttl)

    def close(self) -> None:
        self.inner.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class AsyncDelegating:
    """An async locker of its own (no kit base class)."""

    def __init__(self, inner: AsyncDistributedLock) -> None:
        self.inner = inner

    @property
    def capabilities(self) -> frozenset[Capability]:
        return self.inner.capabilities

    @property
    def url(self) -> str:
        return self.inner.url

    async def try_acquire(
        self, name: str, *, ttl: float | str | timedelta | None = None
    ) -> AsyncLease | None:
        return await self.inner.try_acquire(name, ttl=ttl)

    async def try_acquire_many(
        self, names: Iterable[str], *, ttl: float | str | timedelta | None = None
    ) -> Mapping[str, AsyncLease | None]:
        return await self.inner.try_acquire_many(names, ttl=ttl)

    async def acquire(
        self,
        name: str,
        *,
        timeout: float | str | timedelta | None = None,
        ttl: float | str | timedelta | None = None,
    ) -> AsyncLease:
        return await self.inner.acquire(name, timeout=timeout, ttl=ttl)

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


def test_the_function_form_holds_any_locker(memory_url: str) -> None:
    lock = name()
    with Delegating(multilock.connect(memory_url)) as mine, multilock.connect(memory_url) as other:
        assert not hasattr(mine, "hold")
        with multilock.hold(mine, lock, at_least=AT_LEAST) as lease:
            assert lease is not None
        assert other.try_acquire(lock) is None
        poll("free after at_least", lambda: other.try_acquire(lock), AT_LEAST + SLACK).release()

    async def scenario() -> None:
        async with AsyncDelegating(multilock.connect_async(memory_url)) as theirs:
            async with multilock.hold(theirs, lock, at_least=AT_LEAST) as lease:
                assert lease is not None
            assert await theirs.try_acquire(lock) is None
            got = await apoll("free", lambda: theirs.try_acquire(lock), AT_LEAST + SLACK)
            await got.release()

    asyncio.run(scenario())


# --- once_per_tick -----------------------------------------------------------------------


def record(ran: list[int], i: int) -> int:
    """A job body: note who ran."""
    ran.append(i)
    return i


def test_once_per_tick_runs_a_tick_on_one_replica_only(url: str) -> None:
    """Five replicas (a locker each) call the job for the same tick from five threads at
    once: one runs it, four get None; the tick after the hold runs again."""
    lock, ran = name(), list[int]()
    ticks = [time.time()]
    lockers = [multilock.connect(url) for _ in range(5)]
    try:
        jobs = [
            multilock.once_per_tick(
                locker, lock, hold=AT_LEAST, skew_tolerance=0.1, tick=lambda: ticks[-1]
            )(functools.partial(record, ran, i))
            for i, locker in enumerate(lockers)
        ]
        results: list[int | None] = [None] * 5
        start = threading.Barrier(5)

        def call(i: int) -> None:
            start.wait()
            results[i] = jobs[i]()

        threads = [threading.Thread(target=call, args=(i,)) for i in range(5)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert len(ran) == 1, ran
        assert results.count(None) == 4
        assert results[ran[0]] == ran[0]
        # Later replicas of that tick skip while the hold lasts.
        assert jobs[0]() is None
        assert len(ran) == 1
        # The next tick, once the hold is over, runs (on whichever replica calls first).
        poll("the hold over", lambda: time.time() > ticks[0] + AT_LEAST, AT_LEAST + SLACK)
        ticks.append(time.time())
        poll("the next tick's lock free", lambda: jobs[3]() == 3, SLACK)
        assert ran[1:] == [3]
    finally:
        for locker in lockers:
            locker.close()


def test_once_per_tick_skips_a_tick_it_is_too_late_for(
    memory_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Acquired after tick + hold - 2 x skew by this clock: skipped, with a WARNING."""
    ran: list[int] = []
    with multilock.connect(memory_url) as locker:
        job = multilock.once_per_tick(
            locker, name(), hold=1.0, skew_tolerance=0.25, tick=lambda: time.time() - 0.6
        )(lambda: ran.append(1))
        with caplog.at_level(logging.WARNING, logger="multilock.once"):
            assert job() is None
        assert not ran
        assert "later than hold - 2 x skew tolerance" in caplog.text


def test_once_per_tick_on_coroutines(url: str) -> None:
    async def scenario() -> None:
        lock, ran = name(), list[int]()
        tick = time.time()
        lockers = [multilock.connect_async(url) for _ in range(3)]
        try:

            def job(locker: multilock.AsyncDistributedLock) -> object:
                @multilock.once_per_tick(locker, lock, hold="5s", tick=lambda: tick)
                async def reindex(replica: int) -> int:
                    ran.append(replica)
                    await asyncio.sleep(0.01)
                    return replica

                return reindex

            jobs = [job(locker) for locker in lockers]
            results = await asyncio.gather(*(j(i) for i, j in enumerate(jobs)))  # type: ignore[operator]
            assert len(ran) == 1
            assert sorted(results, key=str) == sorted([ran[0], None, None], key=str)
        finally:
            for locker in lockers:
                await locker.aclose()

    asyncio.run(scenario())


def test_once_per_tick_refuses_what_cannot_work(memory_url: str) -> None:
    with multilock.connect(memory_url) as locker:
        with pytest.raises(ConfigurationError, match="must be longer than twice the skew"):
            multilock.once_per_tick(locker, "x", hold="0.5s", skew_tolerance="0.25s")
        with pytest.raises(ConfigurationError, match="invalid tick 'hour'"):
            multilock.once_per_tick(locker, "x", hold="30s", tick="hour")  # type: ignore[call-overload]

        async def coroutine() -> None:
            pass

        with pytest.raises(ConfigurationError, match="needs an async locker"):
            multilock.once_per_tick(locker, "x", hold="30s")(coroutine)
        naive = multilock.once_per_tick(locker, "x", hold="30s", tick=lambda: datetime(2026, 1, 1))
        with pytest.raises(ConfigurationError, match="has no timezone"):
            naive(lambda: None)()


# --- ticks ---------------------------------------------------------------------------------


def test_a_tick_is_its_minute_or_second_or_a_multiple_since_the_epoch() -> None:
    moment = datetime(2026, 3, 1, 3, 0, 41, 900_000, tzinfo=UTC).timestamp()
    assert tick_of(moment, "minute") == datetime(2026, 3, 1, 3, 0, tzinfo=UTC).timestamp()
    assert tick_of(moment, "second") == datetime(2026, 3, 1, 3, 0, 41, tzinfo=UTC).timestamp()
    assert tick_of(moment, 15.0) == datetime(2026, 3, 1, 3, 0, 30, tzinfo=UTC).timestamp()


def test_a_given_tick_is_utc_unless_it_says_otherwise() -> None:
    assert parse_tick("2026-01-01T03:00") == datetime(2026, 1, 1, 3, tzinfo=UTC).timestamp()
    assert parse_tick("2026-01-01T05:00+02:00") == parse_tick("2026-01-01T03:00")
    with pytest.raises(ConfigurationError, match="invalid tick 'tomorrow'"):
        parse_tick("tomorrow")


def test_a_replica_may_start_a_tick_until_hold_less_twice_the_skew() -> None:
    """A winner whose clock is ahead by s releases at true tick + hold - s; a replica
    behind by s that took the lock at its tick + hold - 2s did so at true tick + hold - s:
    still held. Later than that, it cannot know."""
    hold, skew = check_hold("30s", "250ms")
    assert latest_start(1000.0, hold, skew) == 1000.0 + 30 - 0.5
    with pytest.raises(ConfigurationError, match="must be longer than twice"):
        check_hold("0.5s", "250ms")


def test_a_hold_that_the_next_tick_would_find_is_refused_where_the_interval_is_known() -> None:
    assert check_hold("2.2s", "350ms", interval=3.0) == pytest.approx((2.2, 0.35))
    with pytest.raises(ConfigurationError, match="must not exceed the interval"):
        check_hold("2.7s", "350ms", interval=3.0)
