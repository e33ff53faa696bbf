"""The backend kit's base classes: validation, idempotent release, shielded release,
and acquires cancelled in flight that leave nothing held.

The backend here is a small one of our own, built on the kit with a gate that holds
the "server's answer" back, so a cancellation can land while an acquire is in flight.
"""

from __future__ import annotations

import asyncio
import os
import re
import warnings
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import TypeVar
from zoneinfo import ZoneInfo

import pytest

from multilock._locks.base import tick_micros
from multilock.backend import (
    AsyncLeaseBase,
    AsyncLockerBase,
    LeaseBase,
    LockerBase,
    LockURL,
    Outcome,
    finish_shielded,
    new_token,
)
from multilock.errors import BackendUnavailable, InvalidLockName, LockLost, MultilockError

T = TypeVar("T")


class _Table:
    """The 'server': who holds which name, and every call that reached it."""

    def __init__(self) -> None:
        self.holders: dict[str, str] = {}
        self.calls: list[str] = []


class SlowLease(AsyncLeaseBase):
    """Releases on the table, after waiting for the table's gate."""

    __slots__ = ("_locker",)

    async def _release(self) -> bool:
        locker: SlowLocker = self._locker  # type: ignore[attr-defined]
        await locker.gate.wait()
        return locker.drop(self)

    async def _extend(self, ttl: float | None) -> float | None:
        return ttl


class SlowLocker(AsyncLockerBase):
    """An async locker whose every server call waits for ``gate``."""

    max_name_length = 16

    def __init__(self, table: _Table, *, fail_acquire: bool = False) -> None:
        super().__init__(LockURL.parse("slow://u:hunter2@h/"), default_ttl=5.0)
        self.table = table
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail_acquire = fail_acquire
        self.entered = asyncio.Event()

    lease_class: type[SlowLease] = SlowLease

    async def _try_acquire(self, name: str, ttl: float) -> AsyncLeaseBase | None:
        self.entered.set()
        await self.gate.wait()
        return self.grant(name, ttl)

    def grant(self, name: str, ttl: float) -> AsyncLeaseBase | None:
        """The 'server' answering an acquire."""
        self.table.calls.append(f"acquire {name}")
        if self.fail_acquire:
            raise BackendUnavailable("connection dropped")
        if name in self.table.holders:
            return None
        lease = self.lease_class(name, name, new_token(), None, ttl)
        lease._locker = self  # type: ignore[attr-defined]
        self.table.holders[name] = lease.token
        return lease

    def drop(self, lease: AsyncLeaseBase) -> bool:
        """The 'server' answering a release."""
        self.table.calls.append(f"release {lease.name}")
        if self.table.holders.get(lease.name) != lease.token:
            return False
        del self.table.holders[lease.name]
        return True

    async def _close(self) -> None:
        self.table.calls.append("close")


class SyncLease(LeaseBase):
    """A sync lease on a table, counting backend releases."""

    __slots__ = ("_table",)

    def _release(self) -> bool:
        table: _Table = self._table  # type: ignore[attr-defined]
        table.calls.append(f"release {self.name}")
        return table.holders.pop(self.name, None) == self.token

    def _extend(self, ttl: float | None) -> float | None:
        return ttl


class SyncLocker(LockerBase):
    """A sync locker on a table; the name ``boom`` makes the backend fail."""

    def __init__(self, table: _Table) -> None:
        super().__init__(LockURL.parse("sync://h/"), default_ttl=5.0)
        self.table = table

    def _try_acquire(self, name: str, ttl: float) -> LeaseBase | None:
        if name == "boom":
            raise BackendUnavailable("connection dropped")
        if name in self.table.holders:
            return None
        lease = SyncLease(name, name, new_token(), None, ttl)
        lease._table = self.table  # type: ignore[attr-defined]
        self.table.holders[name] = lease.token
        return lease

    def _close(self) -> None:
        self.table.calls.append("close")


# Operations already in flight: the same 'server' behind the core's Outcome hooks.


class InFlightLease(SlowLease):
    """Releases through the Outcome hook: the 'server' answers once the gate opens."""

    __slots__ = ()

    def _start_release(self) -> Outcome[bool]:
        locker: InFlightLocker = self._locker  # type: ignore[attr-defined]
        return locker.answer_later(lambda: locker.drop(self))


class InFlightLocker(SlowLocker):
    """A locker whose client has the request in flight once called, as kazoo does: the
    ``_start_*`` hooks return an :class:`Outcome` settled when the gate opens."""

    lease_class = InFlightLease

    def __init__(self, table: _Table) -> None:
        super().__init__(table)
        self.settling: set[asyncio.Future[None]] = set()

    def answer_later(self, answer: Callable[[], T]) -> Outcome[T]:
        outcome: Outcome[T] = Outcome(loop=asyncio.get_running_loop())
        self.entered.set()

        async def settle() -> None:
            await self.gate.wait()
            outcome.set_result(answer())

        self.settling.add(asyncio.ensure_future(settle()))
        return outcome

    def _start_try_acquire(self, name: str, ttl: float) -> Outcome[AsyncLeaseBase | None]:
        return self.answer_later(lambda: self.grant(name, ttl))


@pytest.fixture
def table() -> _Table:
    return _Table()


# --- finish_shielded ----------------------------------------------------------------


def test_finish_shielded_returns_the_result() -> None:
    async def work() -> int:
        await asyncio.sleep(0)
        return 42

    assert asyncio.run(finish_shielded(work())) == 42


def test_finish_shielded_raises_the_work_error() -> None:
    async def work() -> None:
        raise ValueError("inside")

    with pytest.raises(ValueError, match="inside"):
        asyncio.run(finish_shielded(work()))


def test_cancelled_caller_waits_for_the_work_then_is_cancelled() -> None:
    async def scenario() -> list[str]:
        events: list[str] = []
        release = asyncio.Event()

        async def work() -> str:
            await release.wait()
            events.append("work finished")
            return "done"

        async def caller() -> None:
            try:
                await finish_shielded(work())
            except asyncio.CancelledError:
                events.append("caller cancelled")
                raise

        task = asyncio.create_task(caller())
        await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.sleep(0.01)
        task.cancel()  # a second cancel does not cut the work short either
        await asyncio.sleep(0.01)
        assert not task.done(), "the caller returned before the work finished"
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        return events

    assert asyncio.run(scenario()) == ["work finished", "caller cancelled"]


# --- async release and cancelled acquires -------------------------------------------


# The task path (coroutines run in a task) and the Outcome path (already in flight).
LOCKERS = pytest.mark.parametrize("locker_class", [SlowLocker, InFlightLocker])


@LOCKERS
def test_async_release_finishes_when_the_caller_is_cancelled(
    table: _Table, locker_class: type[SlowLocker]
) -> None:
    async def scenario() -> None:
        locker = locker_class(table)
        lease = await locker.try_acquire("job")
        assert lease is not None
        locker.gate.clear()
        task = asyncio.create_task(lease.release())
        await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.sleep(0.01)
        assert not task.done(), "the release must wait for the server's answer"
        locker.gate.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert table.holders == {}

    asyncio.run(scenario())


@LOCKERS
def test_cancel_during_acquire_releases_what_the_server_granted(
    table: _Table, locker_class: type[SlowLocker]
) -> None:
    async def scenario() -> None:
        locker = locker_class(table)
        locker.gate.clear()
        task = asyncio.create_task(locker.try_acquire("job"))
        await asyncio.wait_for(locker.entered.wait(), 5)
        task.cancel()
        await asyncio.sleep(0.01)
        assert not task.done(), "the acquire must wait for the server's answer"
        locker.gate.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert table.calls == ["acquire job", "release job"]
        assert table.holders == {}
        again = await locker.try_acquire("job")
        assert again is not None

    asyncio.run(scenario())


def test_cancel_during_acquire_many_releases_every_granted_name(table: _Table) -> None:
    async def scenario() -> None:
        locker = SlowLocker(table)
        table.holders["taken"] = "someone else"
        locker.gate.clear()
        task = asyncio.create_task(locker.try_acquire_many(["a", "taken", "b"]))
        await asyncio.wait_for(locker.entered.wait(), 5)
        task.cancel()
        locker.gate.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert table.holders == {"taken": "someone else"}

    asyncio.run(scenario())


def test_cancel_during_a_failing_acquire_is_still_a_cancellation(table: _Table) -> None:
    async def scenario() -> None:
        locker = SlowLocker(table, fail_acquire=True)
        locker.gate.clear()
        task = asyncio.create_task(locker.try_acquire("job"))
        await asyncio.wait_for(locker.entered.wait(), 5)
        task.cancel()
        locker.gate.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert table.holders == {}

    asyncio.run(scenario())


def test_async_lease_context_and_aclose(table: _Table) -> None:
    async def scenario() -> None:
        async with SlowLocker(table) as locker:
            lease = await locker.try_acquire("job", ttl="2s")
            assert lease is not None
            async with lease:
                assert lease.held
                assert await locker.try_acquire("job") is None
            assert "released" in repr(lease)
            assert table.holders == {}
            assert await lease.release() is False
        assert locker.closed
        assert table.calls[-1] == "close"
        await locker.aclose()  # idempotent
        assert table.calls.count("close") == 1

    asyncio.run(scenario())


# --- sync bases ----------------------------------------------------------------------


def test_release_is_idempotent(table: _Table) -> None:
    locker = SyncLocker(table)
    lease = locker.try_acquire("job")
    assert lease is not None
    assert lease.release() is True
    assert lease.release() is False
    assert table.calls == ["release job"]
    assert "released" in repr(lease)


def test_release_many_releases_each_once_by_default(table: _Table) -> None:
    sync = SyncLocker(table)
    leases = [sync.try_acquire(name) for name in ("a", "b", "c")]
    held = [lease for lease in leases if lease is not None]
    assert held[1].release() is True
    sync.release_many(held)  # the backend has no batch form: one release each
    assert not any(lease.held for lease in held)
    assert table.calls == ["release b", "release a", "release c"]


def test_async_release_many_finishes_when_cancelled(table: _Table) -> None:
    async def main() -> None:
        locker = SlowLocker(table)
        granted = await locker.try_acquire_many(["a", "b"])
        leases = [lease for lease in granted.values() if lease is not None]
        locker.gate.clear()
        releasing = asyncio.ensure_future(locker.release_many(leases))
        await asyncio.sleep(0)
        releasing.cancel()
        locker.gate.set()
        with pytest.raises(asyncio.CancelledError):
            await releasing
        assert table.holders == {}  # the releases finished all the same

    asyncio.run(main())


def test_a_lost_lease_is_still_released_on_the_backend(table: _Table) -> None:
    locker = SyncLocker(table)
    lease = locker.try_acquire("job")
    assert lease is not None
    lease.lost.set("renewal failed")
    assert not lease.held
    assert "lost" in repr(lease)
    assert lease.release() is True
    assert table.calls == ["release job"]


def test_extend_after_release_or_loss_raises_lock_lost(table: _Table) -> None:
    locker = SyncLocker(table)
    lease = locker.try_acquire("a", ttl=10)
    assert lease is not None
    before = lease.expires_at
    assert before is not None
    lease.extend("20s")
    assert lease.expires_at is not None
    assert lease.expires_at > before
    lease.release()
    with pytest.raises(LockLost, match="was released"):
        lease.extend()
    other = locker.try_acquire("b")
    assert other is not None
    other.lost.set("key expired")
    with pytest.raises(LockLost, match="was lost: key expired"):
        other.extend()


def test_failed_acquire_many_releases_what_it_took(table: _Table) -> None:
    locker = SyncLocker(table)
    with pytest.raises(BackendUnavailable):
        locker.try_acquire_many(["a", "b", "boom"])
    assert table.holders == {}
    assert table.calls == ["release a", "release b"]


def test_acquire_many_gives_a_lease_or_none_per_name(table: _Table) -> None:
    locker = SyncLocker(table)
    table.holders["b"] = "other"
    result = locker.try_acquire_many(["a", "b"])
    assert list(result) == ["a", "b"]
    assert result["a"] is not None
    assert result["b"] is None


def test_acquire_many_rejects_duplicates(table: _Table) -> None:
    with pytest.raises(InvalidLockName, match="same name twice"):
        SyncLocker(table).try_acquire_many(["a", "a"])


@pytest.mark.parametrize(
    ("name", "message"),
    [
        (5, "must be a str, not int"),
        ("\ud800", "not valid Unicode"),
    ],
)
def test_bad_names(table: _Table, name: object, message: str) -> None:
    with pytest.raises(InvalidLockName, match=message):
        SyncLocker(table).try_acquire(name)  # type: ignore[arg-type]


def test_name_length_limit_counts_utf8_bytes(table: _Table) -> None:
    async def scenario() -> None:
        locker = SlowLocker(table)
        assert await locker.try_acquire("é" * 8) is not None  # 16 bytes: at the limit
        with pytest.raises(InvalidLockName, match=r"18 bytes is too long.*at most 16"):
            await locker.try_acquire("é" * 9)

    asyncio.run(scenario())


def test_closed_locker_refuses(table: _Table) -> None:
    locker = SyncLocker(table)
    with locker:
        pass
    with pytest.raises(MultilockError, match="is closed"):
        locker.try_acquire("a")
    with pytest.raises(MultilockError, match="is closed"):
        locker.try_acquire_many(["a", "b"])  # a batch's names are checked together
    assert locker.try_acquire_many([]) == {}
    assert "closed" in repr(locker)


def test_bad_ttl(table: _Table) -> None:
    with pytest.raises(MultilockError, match="invalid ttl"):
        SyncLocker(table).try_acquire("a", ttl="-1s")


def test_url_is_masked(table: _Table) -> None:
    assert "hunter2" not in SlowLocker(table).url
    assert "hunter2" not in repr(SlowLocker(table))


# --- tokens --------------------------------------------------------------------------


def test_tokens_are_unique() -> None:
    tokens = {new_token() for _ in range(10_000)}
    assert len(tokens) == 10_000
    assert all(re.fullmatch(r"[0-9a-f]+-[0-9a-f]{16}-[0-9a-f]+", t) for t in tokens)


def test_tokens_differ_after_fork() -> None:
    parent = new_token()
    read, write = os.pipe()
    with warnings.catch_warnings():
        # Python 3.12+ warns about fork() in a threaded process; the child only writes.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # child: report a token and leave without running pytest's teardown
        os.write(write, new_token().encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 200).decode()
    os.close(read)
    os.waitpid(pid, 0)
    parent_prefix = parent.rsplit("-", 1)[0]
    assert child
    assert not child.startswith(parent_prefix)
    assert int(child.split("-", 1)[0], 16) == pid


def test_an_outcome_cannot_be_cancelled() -> None:
    async def scenario() -> None:
        outcome: Outcome[int] = Outcome(loop=asyncio.get_running_loop())
        assert outcome.cancel() is False
        assert not outcome.cancelled()

    asyncio.run(scenario())


def test_a_tick_in_microseconds_is_exact_in_any_zone_and_century() -> None:
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    for fire in (
        epoch,
        epoch - timedelta(microseconds=1),
        datetime(1, 1, 1, tzinfo=UTC),
        datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        datetime(2026, 3, 29, 3, 30, 0, 123457, tzinfo=ZoneInfo("Europe/Kyiv")),
        datetime(2026, 12, 4, 17, 0, 0, 1, tzinfo=timezone(timedelta(hours=-9, minutes=-30))),
    ):
        assert tick_micros(fire) == (fire - epoch) // timedelta(microseconds=1), fire
    assert tick_micros(1.5) == 1_500_000
