"""The optional fast paths are protocols of ``multilock.abc``: a backend not built on the
kit opts in by implementing them, and a sync locker under the scheduler keeps them.

Both scenarios run the scheduler on a manual clock over memory://: two jobs due at one
instant (one batch of locks), whose lease holds then end together (one batch of
releases).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Self, cast

import multilock
from multilock import EventKind, JobEvent, ManualClock, Scheduler, every
from multilock._locks.memory import MemoryLocker
from multilock._locks.sync_adapter import AsyncLeaseView, AsyncView
from multilock.abc import (
    AsyncDistributedLock,
    AsyncLease,
    Capability,
    SupportsAcquireManyStarted,
    SupportsAsyncReleaseMany,
    SupportsReleaseStarted,
    SupportsWatchReleased,
)
from multilock.backend import Duration, LeaseBase, LockURL, LostSignal
from multilock.testing import apoll

T0 = 1_800_000_000.0
JOBS = ("fast-a", "fast-b")
VIEW = "multilock-sync-locker"  # the name of AsyncView's worker thread


async def nothing() -> None:
    """The job."""


def job_sync() -> None:
    """The job, for a sync locker (it need not be sync itself)."""


async def _settle(rounds: int = 50) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)


class ForeignLease:
    """A lease of a backend written from scratch: it only wraps another's lease, to
    have real locking, and has no ``release_started``."""

    def __init__(self, inner: AsyncLease) -> None:
        self.inner = inner

    @property
    def name(self) -> str:
        """The lock name."""
        return self.inner.name

    @property
    def key(self) -> str | int:
        """The backend's key."""
        return self.inner.key

    @property
    def token(self) -> str:
        """The owner token."""
        return self.inner.token

    @property
    def fencing_token(self) -> int | None:
        """No fencing."""
        return self.inner.fencing_token

    @property
    def expires_at(self) -> datetime | None:
        """The inner lease's."""
        return self.inner.expires_at

    @property
    def lost(self) -> LostSignal:
        """The inner lease's."""
        return self.inner.lost

    @property
    def held(self) -> bool:
        """The inner lease's."""
        return self.inner.held

    async def extend(self, ttl: Duration | None = None) -> None:
        """The inner lease's."""
        await self.inner.extend(ttl)

    async def release(self) -> bool:
        """The inner lease's."""
        return await self.inner.release()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.release()


class ForeignLocker:
    """An async locker that does not inherit the kit, with two fast paths of its own,
    counting how the scheduler calls it."""

    def __init__(self, url: str) -> None:
        self.inner = multilock.connect_async(url)
        self.started: list[list[str]] = []  # try_acquire_many_started's names
        self.awaited: list[list[str]] = []  # try_acquire_many's
        self.released_together: list[list[str]] = []  # release_many's

    @property
    def capabilities(self) -> frozenset[Capability]:
        """The inner locker's."""
        return self.inner.capabilities

    @property
    def url(self) -> str:
        """The inner locker's."""
        return self.inner.url

    async def try_acquire(self, name: str, *, ttl: Duration | None = None) -> AsyncLease | None:
        """One lease, wrapped."""
        lease = await self.inner.try_acquire(name, ttl=ttl)
        return None if lease is None else ForeignLease(lease)

    async def try_acquire_many(
        self, names: Iterable[str], *, ttl: Duration | None = None
    ) -> Mapping[str, AsyncLease | None]:
        """Leases, wrapped (counted: the scheduler should not need this one)."""
        self.awaited.append(list(names))
        granted = await self.inner.try_acquire_many(names, ttl=ttl)
        return {n: None if lease is None else ForeignLease(lease) for n, lease in granted.items()}

    def try_acquire_many_started(
        self, names: Iterable[str], *, ttl: Duration | None = None
    ) -> asyncio.Future[Mapping[str, AsyncLease | None]] | None:
        """A plain future (not the kit's Outcome), settled on a later loop turn."""
        names = list(names)
        self.started.append(names)
        future: asyncio.Future[Mapping[str, AsyncLease | None]] = (
            asyncio.get_running_loop().create_future()
        )

        async def ask() -> None:
            future.set_result(await self.try_acquire_many_uncounted(names, ttl))

        self._asking = asyncio.ensure_future(ask())
        return future

    async def try_acquire_many_uncounted(
        self, names: list[str], ttl: Duration | None
    ) -> Mapping[str, AsyncLease | None]:
        """What ``try_acquire_many`` does, without counting it."""
        granted = await self.inner.try_acquire_many(names, ttl=ttl)
        return {n: None if lease is None else ForeignLease(lease) for n, lease in granted.items()}

    async def release_many(self, leases: Sequence[AsyncLease]) -> None:
        """Release each (counted)."""
        self.released_together.append(sorted(lease.name for lease in leases))
        for lease in leases:
            await lease.release()

    async def acquire(
        self, name: str, *, timeout: Duration | None = None, ttl: Duration | None = None
    ) -> AsyncLease:
        """The inner locker's, wrapped."""
        return ForeignLease(await self.inner.acquire(name, timeout=timeout, ttl=ttl))

    async def aclose(self) -> None:
        """The inner locker's."""
        await self.inner.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


def _two_ticks(lock: object, job: object, url: str) -> list[JobEvent]:
    """Two jobs on ``lock``, due together at T0 + 1; the clock then goes past their
    holds (the hold path: tick claims would release each lease as its run ends, not
    together). Every event, after checking that both names are free again."""
    clock = ManualClock(T0 + 0.9)
    seen: list[JobEvent] = []

    async def scenario() -> None:
        sched = Scheduler(
            lock,  # type: ignore[arg-type]
            clock=clock,
            metrics=False,
            stop_timeout=1,
            tick_claims=False,
        )
        for name in JOBS:
            sched.add_job(job, every(seconds=1), name=name)  # type: ignore[arg-type]
        sched.add_listener(seen.append)
        await sched.start()
        try:
            clock.set(T0 + 1.0)

            async def both_ran() -> bool:
                return sum(e.kind is EventKind.SUCCEEDED for e in seen) == 2

            await apoll("both jobs ran", both_ran, 10)
            clock.set(T0 + 1.9)  # past the holds (fire + 0.75 s), before the next tick
            async with multilock.connect_async(url) as other:

                async def free() -> bool:
                    granted = await other.try_acquire_many(JOBS)
                    for lease in granted.values():
                        if lease is not None:
                            await lease.release()
                    return all(granted.values())

                await apoll("both names free after the holds", free, 10)
        finally:
            await sched.stop()

    asyncio.run(scenario())
    return seen


def test_a_third_party_locker_opts_in_by_implementing_the_protocols(memory_url: str) -> None:
    locker = ForeignLocker(memory_url)
    assert isinstance(locker, SupportsAcquireManyStarted)
    assert isinstance(locker, SupportsAsyncReleaseMany)
    assert not isinstance(locker, SupportsWatchReleased)
    _two_ticks(locker, nothing, memory_url)
    assert locker.started == [list(JOBS)], "the scheduler did not start the batch itself"
    assert locker.awaited == []
    assert locker.released_together == [sorted(JOBS)], "the holds' ends were not one batch"


class CountingSyncLocker(MemoryLocker):
    """The sync memory:// locker, noting on which thread each batch call comes."""

    def __init__(self, url: str) -> None:
        super().__init__(LockURL.parse(url))
        self.batches: list[tuple[str, list[str], str]] = []

    def try_acquire_many(self, names: Iterable[str], *, ttl: Duration | None = None) -> dict:  # type: ignore[type-arg]
        names = list(names)
        on = "view's thread" if threading.current_thread().name.startswith(VIEW) else "other"
        self.batches.append(("acquire", names, on))
        return super().try_acquire_many(names, ttl=ttl)

    def release_many(self, leases: Sequence[LeaseBase]) -> None:
        on = "view's thread" if threading.current_thread().name.startswith(VIEW) else "other"
        self.batches.append(("release", sorted(lease.name for lease in leases), on))
        super().release_many(leases)


def test_async_view_forwards_the_fast_paths(memory_url: str) -> None:
    sync = CountingSyncLocker(memory_url)
    view = AsyncView(sync)
    assert isinstance(view, SupportsAcquireManyStarted)
    assert isinstance(view, SupportsAsyncReleaseMany)
    assert not isinstance(view, SupportsWatchReleased)  # see the module's docstring

    async def direct() -> None:
        started = view.try_acquire_many_started(["view-x", "view-y"], ttl=5)
        granted = await started
        leases = list(granted.values())
        assert all(isinstance(lease, AsyncLeaseView) for lease in leases)
        first = leases[0]
        assert isinstance(first, AsyncLeaseView)
        assert isinstance(first, SupportsReleaseStarted)  # the kit's lease base has it
        started_release = cast("SupportsReleaseStarted", first).release_started()
        assert started_release is None  # released in a batch instead
        await view.release_many([lease for lease in leases if lease is not None])
        assert not any(lease is not None and lease.held for lease in leases)
        for name in ("view-x", "view-y"):
            again = sync.try_acquire(name)
            assert again is not None
            again.release()
        await view.aclose()

    asyncio.run(direct())
    assert sync.batches == [
        ("acquire", ["view-x", "view-y"], "view's thread"),
        ("release", ["view-x", "view-y"], "view's thread"),
    ]
    sync.batches.clear()
    seen = _two_ticks(sync, job_sync, memory_url)
    assert sum(e.kind is EventKind.SUCCEEDED for e in seen) == 2
    assert ("acquire", list(JOBS), "view's thread") in sync.batches
    assert ("release", sorted(JOBS), "view's thread") in sync.batches, "not released together"
    sync.close()


def _typed(locker: ForeignLocker) -> AsyncDistributedLock:
    return locker  # mypy: a ForeignLocker is an AsyncDistributedLock


def _started(locker: ForeignLocker) -> SupportsAcquireManyStarted:
    return locker  # mypy: and implements the protocol
