"""Mutexes for the callers sharing one session connection, each handed to the first
waiter on release: :class:`AsyncMutex` for tasks, which can also be taken without
awaiting (what a backend's started path, ``_start_try_acquire``, ``_start_release``,
needs, running outside any coroutine), and :class:`Mutex` for threads."""

from __future__ import annotations

import asyncio
import collections
import threading

__all__ = ["AsyncMutex", "Mutex"]


class AsyncMutex:
    """Serializes the tasks sharing one session connection: :class:`asyncio.Lock`'s
    behaviour, first come first served, plus :meth:`take`, which takes it without
    awaiting (a started path runs outside any coroutine). A release hands the mutex
    straight to the first waiter, so it is never free while one waits, and
    :meth:`take` cannot jump the queue. ``async with mutex:`` acquires and releases it."""

    __slots__ = ("_locked", "_waiters")

    def __init__(self) -> None:
        self._locked = False
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    def locked(self) -> bool:
        """Whether someone holds it."""
        return self._locked

    def take(self) -> bool:
        """Take it now if it is free; whether it was."""
        if self._locked:
            return False
        self._locked = True
        return True

    async def acquire(self) -> bool:
        """Take it, waiting for it if need be."""
        if self.take():
            return True
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # handed over as the cancellation came: pass it on
            elif waiter in self._waiters:
                self._waiters.remove(waiter)
            raise
        return True

    def release(self) -> None:
        """Hand it to the first waiter still waiting, else free it."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._locked = False

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(self, *exc: object) -> None:
        self.release()


class Mutex:
    """Serializes the threads sharing one session connection: ``threading.Lock``'s
    ``acquire`` and ``release`` (and ``with mutex:``), but a release hands it to the
    first thread waiting, as :class:`AsyncMutex` does. With a plain lock, the thread that
    lets go can take it straight back ahead of one that has waited: a caller whose call
    a health check cut off, retrying at once on the same dead path, while the health
    check, still waiting for the mutex, can no longer bound it (PostgreSQL's sync locker)."""

    __slots__ = ("_guard", "_locked", "_waiters")

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locked = False
        # Each waiter's own lock, held until the mutex is handed over to it.
        self._waiters: collections.deque[threading.Lock] = collections.deque()

    def locked(self) -> bool:
        """Whether someone holds it."""
        return self._locked

    def acquire(self) -> bool:
        """Take it, waiting behind those already waiting if need be."""
        with self._guard:
            if not self._locked:
                self._locked = True
                return True
            waiter = threading.Lock()
            waiter.acquire()
            self._waiters.append(waiter)
        try:
            waiter.acquire()  # released by the release() that hands it over
        except BaseException:
            with self._guard:
                try:
                    self._waiters.remove(waiter)
                    handed = False
                except ValueError:
                    handed = True
            if handed:  # it was ours in the meantime: pass it on
                self.release()
            raise
        return True

    def release(self) -> None:
        """Hand it to the first thread waiting, else free it."""
        with self._guard:
            if self._waiters:
                self._waiters.popleft().release()
            else:
                self._locked = False

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
