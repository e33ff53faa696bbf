"""ShedLock's lock-at-least / lock-at-most over any locker: :func:`hold`.

``with hold(locker, name, at_least="5m", at_most="30m") as lease:`` takes the lock
without waiting (``lease`` is ``None`` when another holder has it); when the block
ends the lease is kept until ``at_least`` has passed since the start (or since the
``since`` instant given, a tick's fire time), then released in the background, so
that a replica that tries a little later finds it held and skips. ``at_most`` is the
lease's ttl on TTL backends: how long the lock outlives a holder that crashed (where
the backend renews leases, a running holder keeps it).

The thin ``hold()`` methods of the lock kit's base classes call this; a locker not
built on them is held with the function, ``multilock.hold(locker, name, ...)``.
"""

from __future__ import annotations

import asyncio
import heapq
import inspect
import itertools
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Generic, TypeVar, overload

from .._durations import Duration, parse_duration
from ..errors import ConfigurationError

if TYPE_CHECKING:
    from ..abc import AsyncDistributedLock, AsyncLease, DistributedLock, Lease

__all__ = ["AsyncHold", "Hold", "hold", "is_async_locker", "release_at"]

log = logging.getLogger("multilock.hold")
LockerT = TypeVar("LockerT")
LeaseT = TypeVar("LeaseT")


def _seconds(value: Duration | None, what: str) -> float:
    """``value`` in seconds; ``None`` or ``0`` is no hold at all."""
    if value is None or (type(value) in (int, float) and value == 0):
        return 0.0
    return parse_duration(value, what=what)


def _instant(since: datetime | float | None) -> float | None:
    if since is None or isinstance(since, float | int):
        return since
    if since.tzinfo is None:
        raise ConfigurationError(f"since={since.isoformat()} has no timezone: give an aware time")
    return since.timestamp()


class _HoldCommon(Generic[LockerT, LeaseT]):
    """What both holds share: the durations checked at once, the lock and its lease."""

    def __init__(
        self,
        locker: LockerT,
        name: str,
        *,
        at_least: Duration | None = None,
        at_most: Duration | None = None,
        since: datetime | float | None = None,
    ) -> None:
        self._locker = locker
        self.name = name
        self.at_least = _seconds(at_least, "at_least")
        self.at_most = None if at_most is None else parse_duration(at_most, what="at_most")
        if self.at_most is not None and self.at_least > self.at_most:
            raise ConfigurationError(
                f"at_least ({self.at_least:g} s) is longer than at_most ({self.at_most:g} s)"
            )
        self.since = _instant(since)
        self.until: float | None = None
        """When (epoch seconds) the lease may be released: ``since + at_least``."""
        self.lease: LeaseT | None = None

    def _start(self) -> None:
        start = time.time() if self.since is None else self.since
        self.until = start + self.at_least


class Hold(_HoldCommon["DistributedLock", "Lease"]):
    """``with hold(locker, name, ...) as lease`` on a sync locker (see :func:`hold`)."""

    def __enter__(self) -> Lease | None:
        self._start()
        self.lease = self._locker.try_acquire(self.name, ttl=self.at_most)
        return self.lease

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        lease, self.lease = self.lease, None
        if lease is not None:
            assert self.until is not None
            release_at(self.until, lease.release)


class AsyncHold(_HoldCommon["AsyncDistributedLock", "AsyncLease"]):
    """``async with hold(locker, name, ...) as lease`` on an async locker."""

    async def __aenter__(self) -> AsyncLease | None:
        self._start()
        self.lease = await self._locker.try_acquire(self.name, ttl=self.at_most)
        return self.lease

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        lease, self.lease = self.lease, None
        if lease is None:
            return
        assert self.until is not None
        if self.until <= time.time():
            await lease.release()  # shielded from the caller's cancellation by the lease
        else:
            _release_on_loop(self.until, lease)


@overload
def hold(
    locker: DistributedLock,
    name: str,
    *,
    at_least: Duration | None = None,
    at_most: Duration | None = None,
    since: datetime | float | None = None,
) -> Hold: ...


@overload
def hold(
    locker: AsyncDistributedLock,
    name: str,
    *,
    at_least: Duration | None = None,
    at_most: Duration | None = None,
    since: datetime | float | None = None,
) -> AsyncHold: ...


def hold(
    locker: DistributedLock | AsyncDistributedLock,
    name: str,
    *,
    at_least: Duration | None = None,
    at_most: Duration | None = None,
    since: datetime | float | None = None,
) -> Hold | AsyncHold:
    """Take ``name`` without waiting and keep it at least ``at_least``, as ShedLock does.

    ``with hold(locker, ...) as lease`` for a sync locker, ``async with`` for an async
    one; ``lease`` is ``None`` when another holder has the lock (the block should then
    do nothing). After the block the lease is kept until ``at_least`` has passed since
    the block began -- or since ``since`` (an aware datetime or epoch seconds: a tick's
    fire time) -- and released in the background (a sync locker's by a daemon thread,
    an async one's by the event loop); past that, at once. ``at_most`` is the lease's
    ttl on TTL backends, so a crashed holder keeps the lock at most that long (where
    the backend renews leases, a holder that runs keeps it); it must not be shorter
    than ``at_least``. A process that exits during the hold ends its session-bound
    leases then; its TTL leases run out by themselves.
    """
    if is_async_locker(locker):
        return AsyncHold(locker, name, at_least=at_least, at_most=at_most, since=since)  # type: ignore[arg-type]
    return Hold(locker, name, at_least=at_least, at_most=at_most, since=since)  # type: ignore[arg-type]


def is_async_locker(locker: object) -> bool:
    """Whether ``locker`` is an async one (its ``try_acquire`` is a coroutine function)."""
    return inspect.iscoroutinefunction(getattr(locker, "try_acquire", None))


# --- releases later -------------------------------------------------------------------


class _Releaser:
    """One daemon thread that calls each release at its time: a lease kept past its block
    costs a heap entry, not a thread."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Callable[[], object]]] = []
        self._order = itertools.count()
        self._cond = threading.Condition(threading.Lock())
        self._thread: threading.Thread | None = None

    def add(self, when: float, release: Callable[[], object]) -> None:
        with self._cond:
            heapq.heappush(self._heap, (when, next(self._order), release))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="multilock-hold-releaser", daemon=True
                )
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap or self._heap[0][0] > time.time():
                    wait = None if not self._heap else self._heap[0][0] - time.time()
                    self._cond.wait(wait)
                _, _, release = heapq.heappop(self._heap)
            _call(release)


def _call(release: Callable[[], object]) -> None:
    try:
        release()
    except Exception as exc:  # the lease ends by itself (session, ttl): said, not raised
        log.warning("releasing a held lease failed: %s: %s", type(exc).__name__, exc)


_releaser = _Releaser()


def _after_fork() -> None:
    global _releaser
    _releaser = _Releaser()  # the parent's thread is not in the child: start afresh


os.register_at_fork(after_in_child=_after_fork)


def release_at(when: float, release: Callable[[], object]) -> None:
    """Call ``release()`` at ``when`` (epoch seconds) on the releaser thread, or now if
    that has passed; an error is logged, never raised."""
    if when <= time.time():
        _call(release)
    else:
        _releaser.add(when, release)


_pending: set[asyncio.Task[bool]] = set()  # releases started on a loop: kept referenced


def _release_on_loop(when: float, lease: AsyncLease) -> None:
    loop = asyncio.get_running_loop()

    def start() -> None:
        task = loop.create_task(_released(lease.release()))
        _pending.add(task)
        task.add_done_callback(_pending.discard)

    loop.call_at(loop.time() + max(0.0, when - time.time()), start)


async def _released(release: Awaitable[bool]) -> bool:
    try:
        return await release
    except Exception as exc:
        log.warning("releasing a held lease failed: %s: %s", type(exc).__name__, exc)
        return False
