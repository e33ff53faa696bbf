"""The concurrency primitives the generated sync code swaps for the async ones.

The locker is written once, for asyncio, under ``_async/``; ``scripts/async_to_sync.py``
renames ``AsyncMutex``, ``AsyncTicker``, ``AsyncDeadline`` and ``AsyncSocketWatch``
to ``Mutex``, ``Ticker``, ``Deadline`` and ``SocketWatch`` when it generates
``_sync/``. Each pair here has the same shape in both worlds.
"""

from __future__ import annotations

import asyncio
import logging
import os
import select
import selectors
import socket
import sys
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import psycopg

from multilock import advisory_key
from multilock.backend import AsyncMutex, Mutex

__all__ = [
    "AsyncDeadline",
    "AsyncMutex",
    "AsyncSocketWatch",
    "AsyncTicker",
    "Cut",
    "Deadline",
    "KeyCache",
    "Mutex",
    "SocketWatch",
    "Ticker",
    "readable",
    "shut_down",
]

_log = logging.getLogger("multilock.postgres")


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


SETTLE = 0.02
"""Seconds a session stays idle before its socket is watched. Watching costs system
calls (and, for asyncio, a reader handle) that a busy session would pay on every
round trip; a busy session's next round trip meets a dead session itself. Either
way the loss is seen within about this long."""


class SocketWatch:
    """Calls ``on_readable()`` from a daemon thread when an idle session's socket has
    something to read.

    Nobody reads an idle session's socket: when the server ends the session
    (``pg_terminate_backend``, a restart, a failover) its last message and the end of
    the stream wait there until the next round trip. The locker says when a round
    trip starts (:meth:`busy`) and ends (:meth:`idle`, or :meth:`clear` once no
    lease is held), under its mutex; once the session has been idle for
    :data:`SETTLE` seconds, the thread registers the socket (taking the mutex for
    that instant, so that no round trip is in flight), and a round trip unregisters
    it. A session in steady use thus costs no system call per round trip. The thread
    holds the owner only weakly, as :class:`Ticker` does, and ends when the owner is
    collected without ``stop()``.
    """

    def __init__(self, mutex: Mutex, on_readable: Callable[[], None], name: str) -> None:
        self._mutex = mutex
        self._on_readable = weakref.WeakMethod(on_readable)
        self._name = name
        self._fd: int | None = None  # the socket to watch once idle; None: nothing to watch
        self._idle_at = 0.0
        self._armed: int | None = None  # the descriptor registered, while it is
        self._forever = False  # the thread waits with no timeout: wake it for news
        self._stopped = False
        self._thread: threading.Thread | None = None
        # Made with the thread: a locker that never holds a lease opens no descriptor.
        self._selector: selectors.BaseSelector | None = None
        self._wake_w: socket.socket | None = None
        weakref.finalize(on_readable.__self__, self._abandon)  # type: ignore[attr-defined]

    def busy(self) -> None:
        """A round trip starts (caller holds the mutex): its answer is no news."""
        if self._armed is not None:
            self._unregister()
            if threading.current_thread() is not self._thread:
                self._wake()  # it waits on the socket alone: back to waiting for idleness

    def idle(self, fd: int) -> None:
        """The session on ``fd`` is idle from now on, with leases held (caller holds
        the mutex)."""
        self._fd = fd
        self._idle_at = time.monotonic()
        if self._thread is None and not self._stopped:
            self._start()
        elif self._forever:
            self._wake()

    def clear(self) -> None:
        """Nothing to watch: no lease held, or no session (caller holds the mutex)."""
        self._fd = None
        if self._armed is not None:
            self._unregister()

    def _start(self) -> None:
        selector = self._selector = selectors.DefaultSelector()
        wake_r, self._wake_w = socket.socketpair()
        wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        selector.register(wake_r, selectors.EVENT_READ)
        self._thread = threading.Thread(
            target=self._run, args=(selector, wake_r), name=self._name, daemon=True
        )
        self._thread.start()

    def _unregister(self) -> None:
        fd, self._armed = self._armed, None
        if fd is not None and self._selector is not None:
            try:
                self._selector.unregister(fd)
            except (KeyError, ValueError, OSError):  # closed under us: the kernel forgot it
                pass

    def _wake(self) -> None:
        if self._wake_w is not None:
            try:
                self._wake_w.send(b"\0")
            except OSError:  # full, or closed: a wake-up is pending anyway
                pass

    def _timeout(self) -> float | None:
        if self._armed is not None or self._fd is None:
            self._forever = True
            return None
        self._forever = False
        return max(0.0, self._idle_at + SETTLE - time.monotonic())

    def _run(self, selector: selectors.BaseSelector, wake_r: socket.socket) -> None:
        try:
            while not self._stopped:
                for key, _ in selector.select(self._timeout()):
                    if key.fileobj is wake_r:
                        _drain(wake_r)
                    elif not self._stopped:
                        self._look()
                if self._armed is None and self._fd is not None and not self._stopped:
                    self._arm_if_settled(selector)
        finally:
            self._selector = None
            selector.close()
            wake_r.close()
            if self._wake_w is not None:
                self._wake_w.close()

    def _arm_if_settled(self, selector: selectors.BaseSelector) -> None:
        if time.monotonic() < self._idle_at + SETTLE:
            return
        # Blocking: a round trip in flight ends within its deadline, and then says
        # whether the session is idle; polling instead would spin meanwhile.
        with self._mutex:
            fd = self._fd
            if fd is None or self._armed is not None or time.monotonic() < self._idle_at + SETTLE:
                return
            try:
                selector.register(fd, selectors.EVENT_READ)
            except (KeyError, ValueError, OSError) as exc:  # closed: the next call says why
                _log.debug("PostgreSQL session watch not armed: %s", exc)
                return
            self._armed = fd

    def _look(self) -> None:
        on_readable = self._on_readable()
        if on_readable is None:
            self._stopped = True
            return
        try:
            on_readable()
        except Exception:  # the watch must outlive one bad look
            _log.exception("PostgreSQL session watch failed")

    def _abandon(self) -> None:
        """The owner is gone without ``stop()``: end the thread, without waiting."""
        self._stopped = True
        self._wake()

    def stop(self) -> None:
        """Stop the thread and wait for a look in progress (unless called from it).
        Call it without holding the mutex."""
        self._stopped = True
        self._wake()
        thread = self._thread
        if thread is not None and threading.current_thread() is not thread:
            thread.join()


def _drain(wake_r: socket.socket) -> None:
    try:
        while wake_r.recv(4096):
            pass
    except OSError:  # nothing more to read
        pass


class AsyncSocketWatch:
    """:class:`SocketWatch` on the running event loop: a timer arms a reader once the
    session has been idle for :data:`SETTLE`, and the reader starts ``on_readable()``
    in a task of its own. psycopg waits for its answers with a reader of its own on
    the same descriptor, which would replace this one: :meth:`busy` removes it first."""

    def __init__(
        self,
        mutex: AsyncMutex,
        on_readable: Callable[[], Coroutine[Any, Any, None]],
        name: str,
    ) -> None:
        self._mutex = mutex
        self._on_readable = weakref.WeakMethod(on_readable)
        self._name = name
        self._fd: int | None = None
        self._idle_at = 0.0
        self._armed: tuple[asyncio.AbstractEventLoop, int] | None = None  # the reader's
        self._timer: asyncio.TimerHandle | None = None
        self._timer_loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
        # An owner collected while armed must not leave a reader on a descriptor that
        # its connection closes: the number would be reused.
        weakref.finalize(on_readable.__self__, self._unregister)  # type: ignore[attr-defined]

    def busy(self) -> None:
        """A round trip starts (caller holds the mutex): its answer is no news."""
        if self._armed is not None:
            self._unregister()

    def idle(self, fd: int) -> None:
        """The session on ``fd`` is idle from now on, with leases held."""
        loop = asyncio.get_running_loop()
        self._fd = fd
        self._idle_at = loop.time()
        if self._timer_loop is not loop:  # none yet, or one of a loop that has ended
            self._timer = None
        if self._timer is None and not self._stopped:
            self._timer_loop = loop
            self._timer = loop.call_at(self._idle_at + SETTLE, self._settled, loop)

    def clear(self) -> None:
        """Nothing to watch: no lease held, or no session."""
        self._fd = None
        if self._armed is not None:
            self._unregister()

    def _settled(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        fd = self._fd
        if fd is None or self._armed is not None or self._stopped or self._mutex.locked():
            return  # nothing to watch, or a round trip in flight: its idle() comes next
        due = self._idle_at + SETTLE
        if loop.time() < due:
            self._timer = loop.call_at(due, self._settled, loop)
            return
        loop.add_reader(fd, self._fire)
        self._armed = (loop, fd)

    def _unregister(self) -> None:
        armed, self._armed = self._armed, None
        if armed is not None:
            loop, fd = armed
            loop.remove_reader(fd)  # a closed loop has nothing left to remove

    def _fire(self) -> None:
        armed = self._armed
        self._unregister()  # level-triggered: it would fire at every turn of the loop
        on_readable = self._on_readable()
        if on_readable is not None and armed is not None:
            self._task = armed[0].create_task(on_readable(), name=self._name)

    async def stop(self) -> None:
        """Stop watching and wait for a look in progress (unless called from it)."""
        self._stopped = True
        self.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        task = self._task
        if task is not None and not task.done() and task is not asyncio.current_task():
            try:
                await task
            except RuntimeError:  # the task belongs to a loop that is gone
                pass


def readable(fd: int) -> bool:
    """Whether ``fd`` has something to read right now (data or the end of the stream)."""
    poller = select.poll()  # not select(): it cannot take a descriptor past 1023
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


class Cut:
    """Shuts a psycopg connection's socket down (any thread): a call blocked on it fails
    at once. As a deadline's action, it remembers having cut, so that the failure it
    causes can say why."""

    def __init__(self, conn: Any, seconds: float) -> None:
        self._conn = conn  # a psycopg connection, sync or async
        self.seconds = seconds
        """The deadline this cut enforces."""
        self.done = False
        """Whether it cut."""

    def __call__(self) -> None:
        self.done = True
        try:
            if not self._conn.closed:
                shut_down(self._conn.pgconn.socket)
        except psycopg.Error:  # closed meanwhile: nothing left to cut
            pass


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
    can only name a key it has seen hashed: advisory keys are one-way. The bound
    holds a batch of 10,000 jobs due together, each tick after tick.
    """

    def __init__(self, size: int = 65_536, size_bytes: int = 8 * 1024 * 1024) -> None:
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
                    if len(self._keys) >= self._size or self._bytes + cost > self._size_bytes:
                        self._make_room(cost)
                    self._keys[name] = key
                    self._names[key] = name
                    self._bytes += cost
        return key

    def _make_room(self, cost: int) -> None:
        """Forgets the oldest names, down to 7/8 of both bounds with room for ``cost``:
        an eighth at a time, in one pass, because each lookup of the oldest entry
        would scan the slots of the ones removed before it."""
        count, size = len(self._keys), self._bytes
        most, most_bytes = self._size * 7 // 8, self._size_bytes * 7 // 8 - cost
        gone = []
        for oldest in self._keys:  # oldest first
            if count <= most and size <= most_bytes:
                break
            gone.append(oldest)
            count -= 1
            size -= sys.getsizeof(oldest)
        for oldest in gone:
            key = self._keys.pop(oldest)
            if self._names.get(key) == oldest:
                del self._names[key]
        self._bytes = size

    @property
    def size_bytes(self) -> int:
        """The bytes of the names kept now."""
        return self._bytes

    def name(self, key: int) -> str | None:
        """The last name seen with ``key``, if still remembered."""
        return self._names.get(key)
