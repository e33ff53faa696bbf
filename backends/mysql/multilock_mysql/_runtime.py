"""What the generated sync code swaps for the async code: primitives and driver glue.

The locker is written once, for asyncio and aiomysql, under ``_async/``;
``scripts/async_to_sync.py`` renames ``aiomysql`` to ``pymysql`` and each ``Async*`` or
``async_*`` name here to its twin when it generates ``_sync/``. Each pair has the
same shape in both worlds.

The watches read two private attributes of the drivers, the only way to the
session's socket: PyMySQL's ``Connection._sock`` and aiomysql's
``Connection._writer`` (the dependencies are pinned below their next major version).
"""

from __future__ import annotations

import asyncio
import logging
import os
import select
import socket
import struct
import threading
import time
import weakref
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any

import aiomysql
import pymysql
from pymysql.constants import CLIENT, COMMAND, SERVER_STATUS

from multilock.backend import AsyncMutex

from ._config import Settings

__all__ = [
    "Answer",
    "AsyncBound",
    "AsyncGuard",
    "AsyncMutex",
    "AsyncWatch",
    "Bound",
    "Guard",
    "Hangup",
    "Mutex",
    "Row",
    "Tap",
    "Watch",
    "ask",
    "async_ask",
    "async_connect",
    "async_hang_up",
    "async_is_open",
    "connect",
    "hang_up",
    "is_open",
]

_log = logging.getLogger("multilock.mysql")


Mutex = threading.Lock
"""Serializes the threads sharing one session connection."""


# -- the bound of one round trip ----------------------------------------------------------


class Bound:
    """``with Bound(seconds) as bound:`` around a call that has no session to cut yet
    (connecting) or has a connection of its own (``locks()``, ``close()``), which it
    names with ``bound.watch(conn)`` once it has one. Past ``seconds`` the watchdog shuts
    that connection's socket down, which fails the read in flight, and the block
    raises :class:`TimeoutError`. Before a connection exists, PyMySQL's
    ``connect_timeout`` bounds connecting."""

    def __init__(self, seconds: float) -> None:
        self._guard = Guard(lambda: None)
        self._guard._seconds = seconds

    def watch(self, conn: Any) -> None:
        """Cut ``conn`` when the block outlives its bound."""
        self._guard._conn = conn

    def __enter__(self) -> Bound:
        self._guard.__enter__()
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._guard.__exit__()
        if et is not None and self._guard.expired:
            raise TimeoutError(f"no answer within {self._guard._seconds:g} s") from None


class Guard:
    """Bounds each round trip of one session: ``with guard.until(seconds, conn):``.

    PyMySQL's socket timeouts bound each read and write alone, set here to ``seconds``
    (PyMySQL applies a change on its next read or write). An answer trickling in a
    byte at a time keeps every read short and the round trip alive for ever: the
    process's one watchdog thread (:class:`_Watchdog`) cuts a round trip past its
    due time by shutting the session's socket down, which fails the read in flight,
    and :attr:`expired` says why. A guard is handed to the watchdog once, and stays
    with it while round trips follow one another: each one only notes its due time.
    """

    def __init__(self, cut: Callable[[], None]) -> None:
        self._lock = threading.Lock()  # the watchdog never cuts a later round trip
        self._conn: Any = None
        self._seconds = 0.0
        self.due: float | None = None
        """When the round trip in flight is cut (monotonic), or ``None`` when idle."""
        self._watched = False  # the watchdog has this guard (it drops idle ones)
        self.expired = False
        """Whether the last round trip was cut for taking too long."""

    def until(self, seconds: float, conn: Any) -> Guard:
        """Bound the next round trip on ``conn`` by ``seconds``."""
        if conn._read_timeout != seconds:
            conn._read_timeout = conn._write_timeout = seconds
        self._conn, self._seconds = conn, seconds
        return self

    def __enter__(self) -> None:
        self.expired = False
        due = time.monotonic() + self._seconds
        with self._lock:
            self.due = due
            watched, self._watched = self._watched, True
        if not watched or due < _WATCHDOG.wake:  # new to it, or due before it wakes
            _WATCHDOG.watch(self, due)

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self.due = None

    def cut_if_due(self, now: float) -> bool:
        """Cut the round trip in flight if it is past its due time (the watchdog's
        thread); whether this guard is done with (idle, or cut)."""
        with self._lock:
            due = self.due
            if due is None:
                self._watched = False
                return True
            if now < due:
                return False
            self.expired = True
            self.due = None
            self._watched = False
            sock = getattr(self._conn, "_sock", None)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked read; close() would not
            except OSError:
                pass  # closed meanwhile: the round trip is over anyway
        return True


class _Watchdog:
    """One daemon thread per process cutting the sync round trips past their due time.

    It sleeps until the earliest due time it knows of; a round trip due earlier than
    that wakes it (with one bound for all, the usual case, a new round trip is due
    later than those before it, and nothing is woken). It keeps a guard until it finds
    it idle or cuts it.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._guards: set[Guard] = set()
        self.wake = float("inf")
        """When it wakes next (monotonic): a due time earlier than this must tell it."""
        self._pid = 0

    def watch(self, guard: Guard, due: float) -> None:
        """Cut ``guard``'s round trip if still in flight at ``due``."""
        with self._cond:
            self._guards.add(guard)
            if self._pid != os.getpid():  # none yet, or this is a forked child
                self._pid = os.getpid()
                self.wake = float("inf")
                name = "multilock-mysql-watchdog"
                threading.Thread(target=self._run, name=name, daemon=True).start()
            elif due < self.wake:
                self._cond.notify()

    def _run(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                earliest = float("inf")
                for guard in list(self._guards):
                    if guard.cut_if_due(now):
                        self._guards.discard(guard)
                    elif guard.due is not None:
                        earliest = min(earliest, guard.due)
                self.wake = earliest
                self._cond.wait(None if earliest == float("inf") else earliest - now)


_WATCHDOG = _Watchdog()


class AsyncGuard:
    """Bounds each round trip of one session: ``async with guard.until(seconds, conn):``
    -- past ``seconds``, ``cut()`` closes the session's connection, which fails the read
    in flight, and :attr:`expired` says why.

    A timeout and a timer for each round trip would cost about 5 µs each time. This
    keeps one timer per session instead, re-armed only when it fires: a round trip just
    notes when it started.
    """

    GRACE = 0.1
    """Seconds more for a round trip, once, when the timer fired late by more than this:
    a loop that was itself held up (blocking code in another task) has not read the
    answer waiting in the socket, which is no fault of the session. Once: a loop that
    stays late must not put the deadline off for ever."""

    def __init__(self, cut: Callable[[], None]) -> None:
        self._seconds = 0.0  # of the round trip in flight
        self._cut = cut
        self._started: float | None = None
        self._graced = False
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.expired = False
        """Whether the last round trip was cut for taking too long."""

    def until(self, seconds: float, conn: Any) -> AsyncGuard:
        """Bound the next round trip by ``seconds``."""
        self._seconds = seconds
        return self

    async def __aenter__(self) -> None:
        self.enter(asyncio.get_running_loop())

    async def __aexit__(self, *exc: object) -> None:
        self._started = None

    def enter(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start a round trip without awaiting (the started path): what ``async with``
        does on entry; :meth:`leave` ends it."""
        self.expired = False
        self._graced = False
        self._started = now = loop.time()
        due = now + self._seconds
        if self._timer is None or self._loop is not loop:  # none, or one of an ended loop
            self._arm(loop, due)
        elif self._timer.when() > due:  # armed for a longer round trip than this one
            self._timer.cancel()
            self._arm(loop, due)

    def leave(self) -> None:
        """End the round trip begun by :meth:`enter`."""
        self._started = None

    def cancel(self) -> None:
        """Drop the timer: for a guard used once."""
        self._started = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self, loop: asyncio.AbstractEventLoop, due: float) -> None:
        self._loop = loop
        self._timer = loop.call_at(due, self._fire, loop, due)

    def _fire(self, loop: asyncio.AbstractEventLoop, due: float) -> None:
        self._timer = None
        started = self._started
        if started is None:
            return  # idle: the next round trip arms it again
        now = loop.time()
        if now - due > self.GRACE and not self._graced:
            self._graced = True
            self._arm(loop, now + self.GRACE)  # the loop was held up: let it read first
        elif now < started + self._seconds:
            self._arm(loop, started + self._seconds)  # a later round trip: its own due time
        else:
            self.expired = True
            self._cut()


class AsyncBound:
    """``async with AsyncBound(seconds):`` cancels the block after ``seconds`` and raises
    :class:`TimeoutError`: for the rare calls that have no connection to cut yet
    (connecting) or of their own (``locks()``, ``close()``). An :class:`AsyncGuard` keeps
    the time, with its grace for a late event loop."""

    def __init__(self, seconds: float) -> None:
        self._timeout = asyncio.timeout(None)
        self._guard = AsyncGuard(self._expire).until(seconds, None)

    def _expire(self) -> None:
        self._timeout.reschedule(asyncio.get_running_loop().time())

    def watch(self, conn: Any) -> None:
        """Nothing to do: cancelling the block fails the call in flight."""

    async def __aenter__(self) -> AsyncBound:
        await self._timeout.__aenter__()
        await self._guard.__aenter__()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._guard.cancel()
        await self._timeout.__aexit__(et, ev, tb)


# -- connections --------------------------------------------------------------------------

_CR_SSL_CONNECTION_ERROR = 2026


def _insist_on_tls(conn: Any, required: bool) -> None:
    """Before the credentials go out: refuse a server that does not offer TLS when the
    URL's ``ssl_mode`` insists on it. Both drivers would go on in clear (aiomysql always,
    PyMySQL before 1.2), and a man in the middle can take the offer out."""
    if required and not conn.server_capabilities & CLIENT.SSL:
        raise pymysql.err.OperationalError(
            _CR_SSL_CONNECTION_ERROR, "the server does not offer TLS, which ssl_mode requires"
        )
    # PyMySQL >= 1.2 insists whenever given a context; ssl_mode=preferred does not.
    conn._ssl_required = required


class _Connection(pymysql.connections.Connection):
    """PyMySQL's connection, refusing a server without TLS where the URL insists."""

    def __init__(self, tls_required: bool, **kwargs: Any) -> None:
        self._tls_required = tls_required
        super().__init__(**kwargs)

    def _request_authentication(self) -> None:
        _insist_on_tls(self, self._tls_required)
        super()._request_authentication()  # type: ignore[misc]


class _AsyncConnection(aiomysql.Connection):  # type: ignore[misc]
    """aiomysql's connection, refusing a server without TLS where the URL insists."""

    def __init__(self, tls_required: bool, **kwargs: Any) -> None:
        self._tls_required = tls_required
        super().__init__(**kwargs)

    async def _request_authentication(self) -> None:
        _insist_on_tls(self, self._tls_required)
        await super()._request_authentication()


def connect(settings: Settings, bound: Bound | None = None) -> pymysql.Connection[Any]:
    """A PyMySQL session to the server of ``settings``, with TLS as its ``ssl_mode`` says;
    ``bound`` watches it from before the handshake (a greeting may trickle in too)."""
    conn = _Connection(settings.tls_required, defer_connect=True, **settings.sync_connect_kwargs())
    if bound is not None:
        bound.watch(conn)
    conn.connect()
    return conn


async def async_connect(settings: Settings, bound: AsyncBound | None = None) -> Any:
    """An aiomysql session to the server of ``settings``, with TLS as its ``ssl_mode`` says
    (``bound`` cancels the block it guards: nothing to watch)."""
    conn = _AsyncConnection(settings.tls_required, **settings.async_connect_kwargs())
    await conn._connect()  # what aiomysql.connect() does (it closes the socket on failure)
    return conn


def is_open(conn: Any) -> bool:
    """Whether a PyMySQL connection still has its socket."""
    return bool(conn.open)


def async_is_open(conn: Any) -> bool:
    """Whether an aiomysql connection still has its socket."""
    return not conn.closed


def hang_up(conn: Any) -> None:
    """Close a PyMySQL connection (politely if it is open); never raises."""
    try:
        if conn.open:
            conn.close()
    except Exception:  # closed under us, or a dead socket: gone either way
        conn._force_close()


def async_hang_up(conn: Any) -> None:
    """Close an aiomysql connection; never raises."""
    conn.close()


# -- the answers to the locker's statements ------------------------------------------------

Row = tuple[bytes | None, ...]
"""One row as the server wrote it: each column's text, or ``None`` for ``NULL``."""

_STATUS = struct.Struct("<H")
_MORE = SERVER_STATUS.SERVER_MORE_RESULTS_EXISTS


class Answer:
    """The answer to one query of the locker, read packet by packet (:meth:`feed`): the
    first row of its last result set (:attr:`row`) and the server's status.

    The drivers' cursors build a result object per statement, decode every column's
    description and convert every value; the locker's statements answer one short
    row, which this reads in a few steps. Neither driver asks for ``DEPRECATE_EOF``, so
    an EOF packet ends the column definitions and the rows of each result set. An
    error packet never reaches :meth:`feed`: the drivers' ``_read_packet`` raises it.
    """

    __slots__ = ("_columns", "_skip", "row", "status")

    def __init__(self) -> None:
        self.row: Row = ()
        self.status = 0
        self._columns = -1  # of the result set being read; -1 between result sets
        self._skip = 0  # column definitions (and their EOF) still to come

    def feed(self, packet: Any) -> bool:
        """Take the next packet of the answer (a PyMySQL ``MysqlPacket``); whether it
        was the last."""
        if self._skip:
            self._skip -= 1
            return False
        if self._columns < 0:  # a statement's answer begins: OK, or a result set
            if packet.is_ok_packet():
                packet.advance(1)
                packet.read_length_encoded_integer()  # affected rows
                packet.read_length_encoded_integer()  # last insert id
                return self._ended(packet.read(2))
            self._columns = packet.read_length_encoded_integer()
            self._skip = self._columns + 1
            self.row = ()
            return False
        if packet.is_eof_packet():
            self._columns = -1
            return self._ended(packet.get_all_data()[3:5])
        if not self.row:
            read = packet.read_length_coded_string
            self.row = tuple([read() for _ in range(self._columns)])
        return False

    def _ended(self, status: bytes) -> bool:
        (self.status,) = _STATUS.unpack(status)
        return not self.status & _MORE


def ask(conn: Any, query: bytes) -> Row:
    """Send ``query`` on a PyMySQL connection and read its :class:`Answer`: the first row
    of its last result set. Errors as the driver raises them."""
    conn._execute_command(COMMAND.COM_QUERY, query)
    answer = Answer()
    while not answer.feed(conn._read_packet()):
        pass
    conn.server_status = answer.status
    return answer.row


async def async_ask(conn: Any, query: bytes) -> Row:
    """:func:`ask` on an aiomysql connection."""
    await conn._execute_command(COMMAND.COM_QUERY, query)
    answer = Answer()
    while not answer.feed(await conn._read_packet()):
        pass
    conn.server_status = answer.status
    return answer.row


# -- the watch: a session's end, seen at once, and the health check -----------------------

# The events of a socket whose peer hung up. POLLRDHUP (Linux) is a FIN alone, so an
# answer arriving for a round trip never wakes the watch; where there is none, only a
# reset or an error is seen at once and a plain close waits for the health check.
_HANGUP = getattr(select, "POLLRDHUP", 0) | select.POLLHUP | select.POLLERR


class Watch:
    """One daemon thread per locker, started with its first session: it calls
    ``ended(conn)`` the moment the server hangs up the session of ``conn`` (a KILL, a
    shutdown, ``wait_timeout``) -- nobody reads an idle session's socket, so nothing
    else would notice before the next call -- and ``check()`` every ``interval``
    seconds, off the callers' threads, so that a caller blocked in a long job cannot
    delay the health check. The thread holds the owner only weakly: a locker dropped
    without ``close()`` does not keep a thread alive.
    """

    def __init__(
        self,
        ended: Callable[[Any], None],
        check: Callable[[], None],
        interval: float,
        name: str,
    ) -> None:
        self._ended = weakref.WeakMethod(ended)
        self._check = weakref.WeakMethod(check)
        self._interval = interval
        self._name = name
        self._conn: Any = None
        self._generation = 0  # bumped by each watch(): a new session to look at
        self._stopped = False
        self._thread: threading.Thread | None = None
        self._wake_r, self._wake_w = -1, -1

    def watch(self, conn: Any) -> None:
        """Look at ``conn``'s socket from now on (``None``: at nothing)."""
        self._conn = conn
        self._generation += 1
        if self._thread is None:
            if conn is None or self._stopped:
                return
            self._wake_r, self._wake_w = os.pipe()
            os.set_blocking(self._wake_w, False)
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()
        else:
            self._wake()

    def ensure_running(self) -> None:
        """Nothing to do: the thread runs until stopped (the async twin may need to)."""

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"\0")
        except OSError:  # full (a wake-up is pending anyway) or closed (stopped)
            pass

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self._wake_r, select.POLLIN)
        watched: int | None = None
        conn: Any = None  # the connection of the watched socket
        seen = -1  # the generation whose socket was registered, or hung up
        due = time.monotonic() + self._interval
        try:
            while not self._stopped:
                if seen != self._generation:
                    if watched is not None:
                        poller.unregister(watched)
                        watched = None
                    seen, conn = self._generation, self._conn
                    sock = None if conn is None else conn._sock
                    if sock is not None and sock.fileno() >= 0:
                        watched = sock.fileno()
                        poller.register(watched, _HANGUP)
                wait = max(0.0, due - time.monotonic())
                for fd, _ in poller.poll(wait * 1000):
                    if fd == self._wake_r:
                        os.read(self._wake_r, 4096)
                    elif fd == watched and not self._stopped:
                        poller.unregister(fd)  # level-triggered: once is enough
                        watched = None
                        self._call(self._ended, conn)
                if time.monotonic() >= due and not self._stopped:
                    self._call(self._check)
                    due = time.monotonic() + self._interval
        finally:
            os.close(self._wake_r)
            os.close(self._wake_w)

    def _call(self, method: weakref.WeakMethod[Callable[..., None]], *args: Any) -> None:
        bound = method()
        if bound is None:  # the owner is gone
            self._stopped = True
            return
        try:
            bound(*args)
        except Exception:  # the watch must outlive one bad call
            _log.exception("MySQL session watch failed")

    def stop(self) -> None:
        """Stop the thread and wait for a call in progress (unless called from it).
        Call it without holding the locker's mutex."""
        self._stopped = True
        thread = self._thread
        if thread is not None:
            self._wake()
            if threading.current_thread() is not thread:
                thread.join()


class Tap:
    """What the started path (``_started.py``) reads the session with, in place of
    aiomysql: the bytes that arrive, and the end of the connection."""

    __slots__ = ()

    def received(self, data: bytes) -> None:
        """Bytes from the server."""

    def ended(self, exc: Exception | None) -> None:
        """The server ended the connection (``exc``: how, if known)."""


class Hangup(asyncio.Protocol):
    """Stands between a transport and aiomysql's protocol, passing everything on, and
    says when the peer ends the connection. While :attr:`tap` is set, what arrives
    goes to it instead: aiomysql is not reading meanwhile."""

    def __init__(self, inner: Any, ended: Callable[[], None]) -> None:
        self._inner = inner
        self._ended = ended
        self.tap: Tap | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        tap = self.tap
        if tap is None:
            self._inner.data_received(data)
        else:
            tap.received(data)

    def pass_on(self, data: bytes) -> None:
        """Hand ``data`` to aiomysql after all."""
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        self._ended()
        if self.tap is not None:
            self.tap.ended(None)
        return self._inner.eof_received()  # type: ignore[no-any-return]

    def connection_lost(self, exc: Exception | None) -> None:
        self._ended()
        if self.tap is not None:
            self.tap.ended(exc)
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()


class AsyncWatch:
    """:class:`Watch` on the running event loop: the session's transport tells at once
    when the server hangs up (its protocol is wrapped, so no read is added), and a task
    awaits ``check()`` every ``interval`` seconds."""

    def __init__(
        self,
        ended: Callable[[Any], Coroutine[Any, Any, None]],
        check: Callable[[], Coroutine[Any, Any, None]],
        interval: float,
        name: str,
    ) -> None:
        self._ended = weakref.WeakMethod(ended)
        self._check = weakref.WeakMethod(check)
        self._interval = interval
        self._name = name
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._endings: set[asyncio.Task[None]] = set()
        self.protocol: Hangup | None = None
        """The protocol in front of aiomysql's on the session watched last."""

    def watch(self, conn: Any) -> None:
        """Be told when the server ends ``conn``'s session (``None``: nothing to do)."""
        self.ensure_running()
        self.protocol = None
        if conn is None:
            return
        transport = conn._writer.transport
        loop = asyncio.get_running_loop()
        told = False

        def ended() -> None:
            nonlocal told
            method = self._ended()
            if told or method is None or self._stop.is_set():
                return
            told = True
            task = loop.create_task(method(conn), name=f"{self._name}-ended")
            self._endings.add(task)
            task.add_done_callback(self._endings.discard)

        self.protocol = Hangup(transport.get_protocol(), ended)
        transport.set_protocol(self.protocol)

    def ensure_running(self) -> None:
        """Start the health task in the running loop unless it runs there: a locker
        may outlive one ``asyncio.run()`` and be used in the next."""
        if self._stop.is_set():
            return
        if self._task is None or self._task.done():
            loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            self._task = loop.create_task(self._run(), name=self._name)

    async def _run(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._stop.wait(), self._interval)
                return
            except TimeoutError:
                pass
            check = self._check()
            if check is None:
                return
            try:
                await check()
            except Exception:  # a health check must never die of one bad tick
                _log.exception("MySQL session health check failed")
            del check

    async def stop(self) -> None:
        """Stop the health task and wait for a check in progress (unless called from it)."""
        self._stop.set()
        task = self._task
        if task is not None and asyncio.current_task() is not task and not task.done():
            try:
                await task
            except RuntimeError:  # the task belongs to a loop that is gone
                pass
