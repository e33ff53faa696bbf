"""``memory://[namespace]``: locks inside one process, for tests and single-process apps.

Every locker of one namespace in the process shares one table, so separate
lockers (and threads, and event loops) exclude each other. Leases last until
released or until :meth:`MemoryLocker.revoke` takes them away, which fires
``lost`` as a server-side loss would: the scheduler's own tests use it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from contextlib import suppress
from types import TracebackType
from typing import Any, Self, TypeVar

from .._url import LockURL, OptionParser, as_duration
from ..abc import Capability
from .base import (
    AsyncLeaseBase,
    AsyncLockerBase,
    AsyncReleaseWatch,
    LeaseBase,
    LockerBase,
    LockInfo,
    ReleaseWatch,
    _LeaseState,
    new_token,
)
from .outcome import Outcome

T = TypeVar("T")

__all__ = ["AsyncMemoryLocker", "MemoryBackend", "MemoryLocker", "backend"]

_OPTIONS = OptionParser({"ttl": as_duration}, {"ttl": 30.0})


class _Namespace:
    def __init__(self) -> None:
        self.guard = threading.Lock()
        self.holders: dict[str, _LeaseState] = {}
        self.fences: dict[str, int] = {}
        self.marks: dict[str, int] = {}  # tick claims: name -> latest fire time claimed (us)
        # The waiting acquires of each name: called (outside the guard) once it is freed.
        self.waiters: dict[str, set[Callable[[], None]]] = {}

    def listen(self, name: str, wake: Callable[[], None]) -> None:
        with self.guard:
            self.waiters.setdefault(name, set()).add(wake)

    def unlisten(self, name: str, wake: Callable[[], None]) -> None:
        with self.guard:
            waiting = self.waiters.get(name)
            if waiting is not None:
                waiting.discard(wake)
                if not waiting:
                    del self.waiters[name]

    def _freed(self, name: str) -> None:
        with self.guard:
            waiting = list(self.waiters.get(name, ()))
        for wake in waiting:
            wake()

    def take(self, name: str, cls: type[_LeaseState], mine: set[_LeaseState]) -> Any:
        """A lease of ``cls`` on ``name`` for a locker whose leases are ``mine``, or
        ``None`` when the name is held."""
        with self.guard:
            if name in self.holders:
                return None
            fence = self.fences.get(name, 0) + 1
            self.fences[name] = fence
            lease = cls(name, name, new_token(), fence)
            lease._space = self  # type: ignore[attr-defined]
            lease._mine = mine  # type: ignore[attr-defined]
            self.holders[name] = lease
        mine.add(lease)
        return lease

    def claim(self, names: list[str], fires: list[int]) -> list[bool]:
        won = []
        with self.guard:
            for name, fire in zip(names, fires, strict=True):
                mark = self.marks.get(name)
                won.append(mark is None or mark < fire)
                if won[-1]:
                    self.marks[name] = fire
        return won

    def drop(self, lease: _LeaseState) -> bool:
        name = lease.name
        with self.guard:
            if self.holders.get(name) is not lease:
                return False  # compare-and-delete: a stale lease never frees the new holder
            del self.holders[name]
            # Read under the same guard (not _freed's second one): most names have no
            # waiter, and a release is on the scheduler's path once per run.
            waiting = self.waiters.get(name)
            if not waiting:
                return True
            woken = list(waiting)
        for wake in woken:
            wake()
        return True

    def revoke(self, name: str, reason: str) -> bool:
        with self.guard:
            lease = self.holders.pop(name, None)
        if lease is None:
            return False
        lease._mine.discard(lease)  # type: ignore[attr-defined]
        self._freed(name)
        return lease.lost.set(reason)


_namespaces: dict[str, _Namespace] = {}
_namespaces_guard = threading.Lock()


def _namespace(url: LockURL) -> _Namespace:
    key = (url.host or "") + url.path
    with _namespaces_guard:
        return _namespaces.setdefault(key, _Namespace())


def _drop(lease: Any) -> bool:
    lease._mine.discard(lease)
    return lease._space.drop(lease)  # type: ignore[no-any-return]


class MemoryLease(LeaseBase):
    """A lease of the ``memory://`` backend (sync API)."""

    # Generated from AsyncMemoryLease by scripts/async_to_sync.py: edit that class and rerun.
    __slots__ = ("_mine", "_space")

    def _release(self) -> bool:
        return _drop(self)

    def _extend(self, ttl: float | None) -> float | None:
        return None  # process-bound: nothing to extend


class AsyncMemoryLease(AsyncLeaseBase):
    """A lease of the ``memory://`` backend (async API)."""

    __slots__ = ("_mine", "_space")

    async def _release(self) -> bool:
        return _drop(self)

    # async-only: nothing to wait for, settled at once, so the base awaits no task
    def _start_release(self) -> Outcome[bool]:
        return _settled(_drop(self))

    async def _extend(self, ttl: float | None) -> float | None:
        return None  # process-bound: nothing to extend


def _settled(value: T) -> Outcome[T]:
    outcome: Outcome[T] = Outcome(loop=asyncio.get_running_loop())
    outcome.set_result(value)
    return outcome


class AsyncMemoryWatch(AsyncReleaseWatch):
    """A waiting acquire's watch on a ``memory://`` name: woken by its release, from any
    thread or event loop of the process."""

    wakes = True

    def __init__(self, space: _Namespace, name: str) -> None:
        self._space = space
        self._name = name
        self._freed = asyncio.Event()
        self._loop = asyncio.get_running_loop()

    def _wake(self) -> None:
        with suppress(RuntimeError):  # the waiter's loop is closed: nobody waits any more
            self._loop.call_soon_threadsafe(self._freed.set)

    async def wait(self, seconds: float) -> None:
        """Until the name is released, or ``seconds`` have passed."""
        with suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._freed.wait()
        self._freed.clear()

    async def __aenter__(self) -> Self:
        self._space.listen(self._name, self._wake)
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._space.unlisten(self._name, self._wake)


class MemoryWatch(ReleaseWatch):
    """A waiting acquire's watch on a ``memory://`` name (sync API)."""

    wakes = True

    def __init__(self, space: _Namespace, name: str) -> None:
        self._space = space
        self._name = name
        self._freed = threading.Event()

    def wait(self, seconds: float) -> None:
        """Until the name is released, or ``seconds`` have passed."""
        self._freed.wait(seconds)
        self._freed.clear()

    def __enter__(self) -> Self:
        self._space.listen(self._name, self._freed.set)
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._space.unlisten(self._name, self._freed.set)


class _MemoryCommon:
    capabilities = frozenset(
        {
            Capability.FENCING,
            Capability.SESSION,
            Capability.LOST_SIGNAL,
            Capability.INTROSPECTION,
            Capability.BATCH,
            Capability.TICK_CLAIM,
        }
    )
    # claim_retention: None (the kit's), marks live as long as the process

    def _setup(self, url: LockURL) -> float:
        values, _ = _OPTIONS.parse(url)
        self._space = _namespace(url)
        self._mine: set[_LeaseState] = set()
        return float(values["ttl"])

    def _take(self, name: str, cls: type[_LeaseState]) -> Any:
        return self._space.take(name, cls, self._mine)

    def revoke(self, name: str, reason: str = "revoked") -> bool:
        """Take ``name`` away from whoever holds it here; their ``lost`` fires."""
        return self._space.revoke(name, reason)

    def locks(self) -> list[LockInfo]:
        """The locks held in this namespace."""
        with self._space.guard:
            held = list(self._space.holders.values())
        return [LockInfo(key=lease.key, name=lease.name, holder=lease.token) for lease in held]

    def _drop_all(self) -> None:
        for lease in list(self._mine):
            self._space.drop(lease)  # which wakes the name's waiters
            lease._released = True
        self._mine.clear()


class MemoryLocker(_MemoryCommon, LockerBase):
    """Sync locker of ``memory://``."""

    # Generated from AsyncMemoryLocker by scripts/async_to_sync.py: edit that class and rerun.
    def __init__(self, url: LockURL) -> None:
        super().__init__(url, default_ttl=self._setup(url))

    def _try_acquire(self, name: str, ttl: float) -> LeaseBase | None:
        lease: LeaseBase | None = self._take(name, MemoryLease)
        return lease

    def watch_released(self, name: str) -> MemoryWatch:
        """A watch woken as soon as ``name`` is released in this namespace."""
        return MemoryWatch(self._space, name)

    def _claim_ticks(self, names: list[str], fires: list[int]) -> list[bool]:
        return self._space.claim(names, fires)

    def _close(self) -> None:
        self._drop_all()


class AsyncMemoryLocker(_MemoryCommon, AsyncLockerBase):
    """Async locker of ``memory://``."""

    def __init__(self, url: LockURL) -> None:
        super().__init__(url, default_ttl=self._setup(url))

    async def _try_acquire(self, name: str, ttl: float) -> AsyncLeaseBase | None:
        lease: AsyncLeaseBase | None = self._take(name, AsyncMemoryLease)
        return lease

    # async-only
    def _start_try_acquire(self, name: str, ttl: float) -> Outcome[AsyncLeaseBase | None]:
        lease: AsyncLeaseBase | None = self._take(name, AsyncMemoryLease)
        return _settled(lease)

    # async-only
    def _start_try_acquire_many(
        self, names: list[str], ttl: float
    ) -> Outcome[dict[str, AsyncLeaseBase | None]]:
        # All in one go, settled at once: no task, nothing to await between names.
        return _settled({name: self._take(name, AsyncMemoryLease) for name in names})

    def watch_released(self, name: str) -> AsyncMemoryWatch:
        """A watch woken as soon as ``name`` is released in this namespace."""
        return AsyncMemoryWatch(self._space, name)

    async def _claim_ticks(self, names: list[str], fires: list[int]) -> list[bool]:
        return self._space.claim(names, fires)

    # async-only: settled at once, so the scheduler claims from its timer, without a task
    def _start_claim_ticks(self, names: list[str], fires: list[int]) -> Outcome[list[bool]]:
        return _settled(self._space.claim(names, fires))

    async def _close(self) -> None:
        self._drop_all()


class _MemoryHooks:
    def crash_release_bound(self, url: LockURL, ttl: float) -> float:
        return 0.0

    def break_lease(self, url: LockURL, locker: object, lease: object) -> None:
        _namespace(url).revoke(lease.name, "revoked by the conformance suite")  # type: ignore[attr-defined]

    def unreachable_url(self, url: LockURL) -> str | None:
        return None  # in-process: there is no server to be unreachable


class MemoryBackend:
    """The ``memory://`` backend (registered through the entry-point group)."""

    conformance = _MemoryHooks()

    def connect(self, url: LockURL) -> MemoryLocker:
        """A sync locker."""
        return MemoryLocker(url)

    def connect_async(self, url: LockURL) -> AsyncMemoryLocker:
        """An async locker."""
        return AsyncMemoryLocker(url)


backend = MemoryBackend()
