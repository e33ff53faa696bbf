"""A mutex for the tasks sharing one session connection, that can be taken without
awaiting: what a backend's started path (``_start_try_acquire``, ``_start_release``)
needs, running outside any coroutine."""

from __future__ import annotations

import asyncio
import collections

__all__ = ["AsyncMutex"]


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
