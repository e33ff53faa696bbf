"""A sync locker (``multilock.connect(url)``) seen through the async contract, so that
the scheduler can use one an application already has.

The optional fast paths of :mod:`multilock.abc` come along where they can: a call
queued on the view's worker thread is started the moment it is queued, so
``try_acquire_many_started`` needs no task of the loop's (nor does a lease's
``release()``); ``release_many`` is one hop to the thread for the whole batch (and one
call of the sync locker's own ``release_many`` where it has one), which the scheduler
uses rather than a lease's ``release_started`` (a hop per lease: the view's leases
answer ``None``). ``watch_released`` is not forwarded: a sync watch's ``wait`` blocks
the one thread every call of the sync locker runs on, for as long as it waits, and no
cancellation can reach it, so a view's waiters poll.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Self, TypeVar

from .._durations import Duration
from ..abc import AsyncLease, Capability, DistributedLock, Lease, SupportsReleaseMany, TickTime
from .base import AsyncLeaseBase, Patience
from .outcome import Outcome, finish_shielded, undo_on_cancel

__all__ = ["AsyncView"]

T = TypeVar("T")
R = TypeVar("R")


class AsyncView:
    """An :class:`~multilock.abc.AsyncDistributedLock` over a sync locker.

    Every call runs on one worker thread of its own, in order: a sync locker
    need not be safe to call from several threads at once.
    """

    def __init__(self, locker: DistributedLock) -> None:
        self.locker = locker
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="multilock-sync-locker")

    async def _call(self, func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, functools.partial(func, *args, **kwargs))

    def _started(self, call: Callable[[], T], then: Callable[[T], R]) -> Outcome[R]:
        """``then(call())``, with ``call`` queued on the worker thread now: the
        :class:`Outcome` of it, settled on the running loop, that nobody need await."""
        loop = asyncio.get_running_loop()
        outcome: Outcome[R] = Outcome(loop=loop)

        def settle(done: asyncio.Future[T]) -> None:
            error = done.exception()
            if error is not None:
                outcome.set_exception(error)
            else:
                outcome.set_result(then(done.result()))

        loop.run_in_executor(self._thread, call).add_done_callback(settle)
        return outcome

    @property
    def capabilities(self) -> frozenset[Capability]:
        """The sync locker's."""
        return self.locker.capabilities

    @property
    def url(self) -> str:
        """The sync locker's (password masked)."""
        return self.locker.url

    async def try_acquire(self, name: str, *, ttl: Duration | None = None) -> AsyncLeaseView | None:
        """``try_acquire`` on the worker thread."""
        lease = await self._call(self.locker.try_acquire, name, ttl=ttl)
        return None if lease is None else AsyncLeaseView(lease, self)

    async def try_acquire_many(
        self, names: Iterable[str], *, ttl: Duration | None = None
    ) -> Mapping[str, AsyncLeaseView | None]:
        """``try_acquire_many`` on the worker thread."""
        leases = await self._call(self.locker.try_acquire_many, list(names), ttl=ttl)
        return self._views(leases)

    def try_acquire_many_started(
        self, names: Iterable[str], *, ttl: Duration | None = None
    ) -> Outcome[Mapping[str, AsyncLease | None]]:
        """``try_acquire_many`` queued on the worker thread now, for a caller that cannot
        await (:class:`~multilock.abc.SupportsAcquireManyStarted`)."""
        call = functools.partial(self.locker.try_acquire_many, list(names), ttl=ttl)
        return self._started(call, self._views)

    def _views(self, leases: Mapping[str, Lease | None]) -> dict[str, AsyncLeaseView | None]:
        return {
            n: None if lease is None else AsyncLeaseView(lease, self) for n, lease in leases.items()
        }

    async def claim_ticks(self, ticks: Mapping[str, TickTime]) -> Mapping[str, bool]:
        """``claim_ticks`` on the worker thread (a sync locker declaring ``TICK_CLAIM``)."""
        won: Mapping[str, bool] = await self._call(self.locker.claim_ticks, dict(ticks))  # type: ignore[attr-defined]
        return won

    async def release_many(self, leases: Sequence[AsyncLease]) -> None:
        """Release ``leases`` (views of this one's) in one hop to the worker thread, by
        the sync locker's ``release_many`` where it has one
        (:class:`~multilock.abc.SupportsAsyncReleaseMany`). Finishes even if the caller
        is cancelled; the first error is raised after the rest."""
        pending = [
            lease.lease for lease in leases if isinstance(lease, AsyncLeaseView) and lease.claim()
        ]
        if pending:
            await finish_shielded(self._call(self._release_all, pending))

    def _release_all(self, leases: list[Lease]) -> None:
        """On the worker thread: the sync locker's ``release_many``, else one by one."""
        if isinstance(self.locker, SupportsReleaseMany):
            self.locker.release_many(leases)
            return
        error: Exception | None = None
        for lease in leases:
            try:
                lease.release()
            except Exception as exc:
                error = error or exc
        if error is not None:
            raise error

    async def acquire(
        self, name: str, *, timeout: Duration | None = None, ttl: Duration | None = None
    ) -> AsyncLeaseView:
        """Wait for ``name`` by polling ``try_acquire`` with jittered backoff: the sync
        locker's own ``acquire`` would hold the one worker thread, and no cancellation
        could reach it. Each try is let finish when cancelled, and its lease released."""
        patience = Patience(name, timeout)
        while True:
            lease = await undo_on_cancel(self.try_acquire(name, ttl=ttl), _one)
            if lease is not None:
                return lease
            await asyncio.sleep(patience.next_wait())

    async def aclose(self) -> None:
        """Stop the worker thread; the sync locker stays open (it belongs to the caller)."""
        await asyncio.to_thread(self._thread.shutdown, wait=True)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


def _one(lease: AsyncLeaseView | None) -> list[AsyncLeaseView | None]:
    return [lease]


def _same(released: bool) -> bool:
    return released


class AsyncLeaseView(AsyncLeaseBase):
    """A sync :class:`~multilock.abc.Lease` seen as an async one (the kit's lease base
    gives the idempotent, cancellation-proof release)."""

    __slots__ = ("_view", "lease")

    def __init__(self, lease: Lease, view: AsyncView) -> None:
        super().__init__(lease.name, lease.key, lease.token, lease.fencing_token)
        self.expires_at = lease.expires_at
        self.lease = lease
        self._view = view
        lease.lost.add_callback(self.lost.set)  # a loss of the sync lease is ours

    def claim(self) -> bool:
        """Mark this lease released, for a release made on its behalf (the view's
        ``release_many``): ``False`` if it was already."""
        if self._released:
            return False
        self._released = True
        return True

    async def _release(self) -> bool:
        return await self._view._call(self.lease.release)

    def _start_release(self) -> Outcome[bool]:
        # Queued on the worker thread now: release() needs no task for it.
        return self._view._started(self.lease.release, _same)

    def release_started(self) -> None:
        """``None``: the scheduler then releases the leases whose holds end together with
        the view's ``release_many``, one hop to the worker thread (and one round trip,
        where the sync locker batches) for all of them, where a started release each
        would be a hop each."""

    async def _extend(self, ttl: float | None) -> float | None:
        await self._view._call(self.lease.extend, ttl)
        expires = self.lease.expires_at
        return None if expires is None else (expires - datetime.now(UTC)).total_seconds()
