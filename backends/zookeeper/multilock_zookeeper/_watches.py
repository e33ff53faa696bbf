"""Waiting acquires woken by ZooKeeper: an exists watch on the lock node.

A locker keeps at most one watch per node (:class:`Watches`), whoever waits on it:
kazoo keeps a watch's callback until the node changes, so one per waiter would pile
up behind a long-held lock. The watch is set after a failed try, by an ``exists``
whose answer says whether the node is still there: gone already, the waiter tries
again at once; there, its deletion (a release, a holder's session ending) fires the
watch and wakes every waiter of the node. A waiter that leaves removes only its own
wake-up; the watch, if it has not fired, stays until the node changes and then finds
nobody to wake. Wake-ups are hints: the kit tries again, and polls besides.

Both APIs' watches are written here by hand (like ``_bridge``): they differ in what
they wait on, an asyncio event set from kazoo's thread or a threading event.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from functools import partial
from types import TracebackType
from typing import Any, Self

from multilock.backend import AsyncReleaseWatch, ReleaseWatch

from ._bridge import async_settle, sync_settle

__all__ = ["AsyncZooKeeperWatch", "Watches", "ZooKeeperWatch"]


class Watches:
    """The exists watches of one kazoo client, and the waiters each one wakes."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._guard = threading.Lock()
        self._wakes: dict[str, set[Callable[[], None]]] = {}
        self._armed: dict[str, Callable[[Any], None]] = {}  # path -> its watch's callback

    def listen(self, path: str, wake: Callable[[], None]) -> None:
        """Call ``wake`` (from kazoo's thread) whenever the node at ``path`` changes."""
        with self._guard:
            self._wakes.setdefault(path, set()).add(wake)

    def unlisten(self, path: str, wake: Callable[[], None]) -> None:
        """Forget ``wake``."""
        with self._guard:
            wakes = self._wakes.get(path)
            if wakes is not None:
                wakes.discard(wake)
                if not wakes:
                    del self._wakes[path]

    def arm(self, path: str) -> Any | None:
        """An ``exists`` that sets the node's watch (its result: the node's stat, or
        ``None`` when it is gone), or ``None`` when a watch is set already."""
        with self._guard:
            if path in self._armed:
                return None
            fired = self._armed[path] = partial(self._fired, path)
        return self._client.exists_async(path, watch=fired)

    def disarm(self, path: str) -> None:
        """The ``exists`` failed: no watch is set."""
        with self._guard:
            self._armed.pop(path, None)

    def _fired(self, path: str, event: Any) -> None:
        with self._guard:
            self._armed.pop(path, None)
            wakes = list(self._wakes.get(path, ()))
        for wake in wakes:
            wake()

    def forget(self) -> None:
        """The session ended and its watches with it: wake everyone to set them again."""
        with self._guard:
            self._armed.clear()
            wakes = [wake for each in self._wakes.values() for wake in each]
        for wake in wakes:
            wake()


def _node_gone(result: Any) -> bool | None:
    """What the watch's ``exists`` says: the node is gone (``True``), still there
    (``False``), or nothing is known (``None``: not answered, or failed)."""
    if not result.ready() or not result.successful():
        return None
    return result.get_nowait() is None


class AsyncZooKeeperWatch(AsyncReleaseWatch):
    """A waiting acquire's watch on a ``zookeeper://`` lock node (async API)."""

    wakes = True

    def __init__(self, watches: Watches, path: str, deadline: Callable[[], float]) -> None:
        self._watches = watches
        self._path = path
        self._deadline = deadline
        self._changed = asyncio.Event()
        self._loop = asyncio.get_running_loop()

    def _wake(self) -> None:
        with suppress(RuntimeError):  # the waiter's loop is closed: nobody waits any more
            self._loop.call_soon_threadsafe(self._changed.set)

    async def wait(self, seconds: float) -> None:
        """Until the node changes, or ``seconds`` have passed."""
        until = time.monotonic() + seconds
        exists = self._watches.arm(self._path)
        if exists is not None:
            await async_settle(exists, min(until, self._deadline()))
            gone = _node_gone(exists)
            if gone is None:
                self._watches.disarm(self._path)
            elif gone:
                return  # released between the try and the watch: try again now
        with suppress(TimeoutError):
            async with asyncio.timeout(max(0.0, until - time.monotonic())):
                await self._changed.wait()
        self._changed.clear()

    async def __aenter__(self) -> Self:
        self._watches.listen(self._path, self._wake)
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._watches.unlisten(self._path, self._wake)


class ZooKeeperWatch(ReleaseWatch):
    """A waiting acquire's watch on a ``zookeeper://`` lock node (sync API)."""

    wakes = True

    def __init__(self, watches: Watches, path: str, deadline: Callable[[], float]) -> None:
        self._watches = watches
        self._path = path
        self._deadline = deadline
        self._changed = threading.Event()

    def wait(self, seconds: float) -> None:
        """Until the node changes, or ``seconds`` have passed."""
        until = time.monotonic() + seconds
        exists = self._watches.arm(self._path)
        if exists is not None:
            sync_settle(exists, min(until, self._deadline()))
            gone = _node_gone(exists)
            if gone is None:
                self._watches.disarm(self._path)
            elif gone:
                return
        self._changed.wait(max(0.0, until - time.monotonic()))
        self._changed.clear()

    def __enter__(self) -> Self:
        self._watches.listen(self._path, self._changed.set)
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._watches.unlisten(self._path, self._changed.set)
