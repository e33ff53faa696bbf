"""A sync locker (``multilock.connect(url)``) seen through the async contract, so that
the scheduler can use one an application already has."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Self, TypeVar

from .._durations import Duration
from ..abc import Capability, DistributedLock, Lease
from .base import AsyncLeaseBase, Patience
from .outcome import undo_on_cancel

__all__ = ["AsyncView"]

T = TypeVar("T")


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
        return {
            n: None if lease is None else AsyncLeaseView(lease, self) for n, lease in leases.items()
        }

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

    async def _release(self) -> bool:
        return await self._view._call(self.lease.release)

    async def _extend(self, ttl: float | None) -> float | None:
        await self._view._call(self.lease.extend, ttl)
        expires = self.lease.expires_at
        return None if expires is None else (expires - datetime.now(UTC)).total_seconds()
