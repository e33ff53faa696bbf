"""The concurrency primitives the generated sync code swaps for the async ones.

The locker is written once, for asyncio, under ``_async/``; ``scripts/unasync.py``
renames ``AsyncMutex``, ``AsyncTicker`` and ``AsyncDeadline`` to ``Mutex``,
``Ticker`` and ``Deadline`` when it generates ``_sync/``. Each pair here has the
same shape in both worlds.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
import threading
import weakref
from collections.abc import Awaitable, Callable

from multilock import advisory_key

__all__ = [
    "AsyncDeadline",
    "AsyncMutex",
    "AsyncTicker",
    "Deadline",
    "KeyCache",
    "Mutex",
    "Ticker",
    "shut_down",
]

_log = logging.getLogger("multilock.postgres")

AsyncMutex = asyncio.Lock
"""Serializes the tasks sharing one session connection."""

Mutex = threading.Lock
"""Serializes the threads sharing one session connection."""


class Ticker:
    """Calls ``tick()`` every ``interval`` seconds on a daemon thread, off the callers'
    threads, so that a caller blocked elsewhere cannot delay a health check.

    The thread holds the owner only weakly: a locker dropped without ``close()``
    does not keep a thread alive forever.
    """

    def __init__(self, interval: float, tick: Callable[[], None], name: str) -> None:
        self._interval = interval
        self._tick = weakref.WeakMethod(tick)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            tick = self._tick()
            if tick is None:
                return
            try:
                tick()
            except Exception:  # a health check must never die of one bad tick
                _log.exception("PostgreSQL session health check failed")
            del tick

    def ensure_running(self) -> None:
        """Nothing to do: the thread runs until stopped (the async twin may need to)."""

    def stop(self) -> None:
        """Stop the thread and wait for a tick in progress (unless called from it)."""
        self._stop.set()
        if threading.current_thread() is not self._thread:
            self._thread.join()


class AsyncTicker:
    """Awaits ``tick()`` every ``interval`` seconds in a task of the running loop."""

    def __init__(self, interval: float, tick: Callable[[], Awaitable[None]], name: str) -> None:
        self._interval = interval
        self._tick = weakref.WeakMethod(tick)
        self._name = name
        self._stop = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run(), name=name)

    async def _run(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._stop.wait(), self._interval)
                return
            except TimeoutError:
                pass
            tick = self._tick()
            if tick is None:
                return
            try:
                await tick()
            except Exception:  # a health check must never die of one bad tick
                _log.exception("PostgreSQL session health check failed")
            del tick

    def ensure_running(self) -> None:
        """Start the task again in the running loop if its loop has ended: a locker
        may outlive one ``asyncio.run()`` and be used in the next."""
        if self._task.done() and not self._stop.is_set():
            self._stop = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._run(), name=self._name)

    async def stop(self) -> None:
        """Stop the task and wait for a tick in progress (unless called from it)."""
        self._stop.set()
        if asyncio.current_task() is not self._task and not self._task.done():
            try:
                await self._task
            except RuntimeError:  # the task belongs to a loop that is gone
                pass


class Deadline:
    """``with Deadline(seconds, expire):`` calls ``expire()`` from a timer thread if
    the block is still running after ``seconds``: the thread that runs the block
    may be the one stuck."""

    def __init__(self, seconds: float, expire: Callable[[], None]) -> None:
        self._timer = threading.Timer(seconds, expire)
        self._timer.daemon = True

    def __enter__(self) -> None:
        self._timer.start()

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()


class AsyncDeadline:
    """``with AsyncDeadline(seconds, expire):`` in a coroutine calls ``expire()`` on
    the event loop if the block is still running after ``seconds``.

    On the loop, not on a thread: a loop that was itself held up (by blocking code in
    some task) has not read the answer waiting in the socket, which is no fault of the
    session. A deadline that fires late by more than a grace period, the loop's lag,
    gives the block that grace period more before it expires.
    """

    GRACE = 0.1

    def __init__(self, seconds: float, expire: Callable[[], None]) -> None:
        self._seconds = seconds
        self._expire = expire
        self._handle: asyncio.TimerHandle | None = None
        self._due = 0.0

    def __enter__(self) -> None:
        self._arm(asyncio.get_running_loop(), self._seconds)

    def __exit__(self, *exc: object) -> None:
        if self._handle is not None:
            self._handle.cancel()

    def _arm(self, loop: asyncio.AbstractEventLoop, delay: float) -> None:
        self._due = loop.time() + delay
        self._handle = loop.call_at(self._due, self._fire, loop)

    def _fire(self, loop: asyncio.AbstractEventLoop) -> None:
        if loop.time() - self._due > self.GRACE:
            self._arm(loop, self.GRACE)
        else:
            self._expire()


def shut_down(fd: int) -> None:
    """Shut down the socket behind ``fd`` in both directions, from any thread: a
    call blocked reading it wakes up to end-of-file. The descriptor stays open
    (its owner closes it), so it cannot be reused under the owner's feet."""
    try:
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        sock.close()


class KeyCache:
    """Advisory keys of the names seen, and names of the keys seen, both bounded: at
    most ``size`` names and ``size_bytes`` bytes of them (long names are allowed, and
    sixty 1 MiB names must not pin 60 MiB).

    Hashing a name costs more than a dict hit on the hot path, and ``locks()``
    can only name a key it has seen hashed: advisory keys are one-way.
    """

    def __init__(self, size: int = 4096, size_bytes: int = 4 * 1024 * 1024) -> None:
        self._size = size
        self._size_bytes = size_bytes
        self._bytes = 0
        self._guard = threading.Lock()
        self._keys: dict[str, int] = {}
        self._names: dict[int, str] = {}

    def key(self, name: str) -> int:
        """The advisory key of ``name``."""
        key = self._keys.get(name)  # the hot path: a hit takes no lock
        if key is None:
            key = advisory_key(name)
            cost = sys.getsizeof(name)
            if cost > self._size_bytes:
                return key  # never kept: it would evict everything else
            with self._guard:  # a sync locker is used from many threads
                if name not in self._keys:
                    while self._keys and (
                        len(self._keys) >= self._size or self._bytes + cost > self._size_bytes
                    ):
                        self._evict()
                    self._keys[name] = key
                    self._names[key] = name
                    self._bytes += cost
        return key

    def _evict(self) -> None:
        oldest = next(iter(self._keys))  # oldest first
        key = self._keys.pop(oldest)
        self._bytes -= sys.getsizeof(oldest)
        if self._names.get(key) == oldest:
            del self._names[key]

    @property
    def size_bytes(self) -> int:
        """The bytes of the names kept now."""
        return self._bytes

    def name(self, key: int) -> str | None:
        """The last name seen with ``key``, if still remembered."""
        return self._names.get(key)
