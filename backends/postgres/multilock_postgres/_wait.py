"""A waiting acquire's watch: a session of its own queued for the key in the server.

The watch asks for the key in *shared* mode, as a transaction lock, on a session of
its own: ``pg_advisory_xact_lock_shared`` queues behind the exclusive holder, whoever
it is (another locker, the Go seed, a session that died), and is granted the moment
the holder lets go. The statement then ends, and its transaction with it, so the
shared lock is dropped as soon as it is granted: the watch never holds the key. It
only tells the acquire, which tries again on the locker's session.

The statement stays queued across the kit's waits (each wait only watches the socket
for its end), so that a long wait is one statement, not one that times out every 2 s
with an error in the server's log. ``lock_timeout`` ends it on the server after
:data:`QUEUED_FOR` (a client that vanished leaves nothing queued for longer); the
watch's exit cancels it and reads its end. Both APIs drive it through libpq's
non-blocking calls: no thread, no task.
"""

from __future__ import annotations

import asyncio
import select
import time
from contextlib import suppress
from types import TracebackType
from typing import Any

import psycopg
from psycopg import pq

from multilock.backend import AsyncReleaseWatch, ReleaseWatch, finish_shielded
from multilock.errors import MultilockError

from ._async import session as _async_session
from ._config import Settings, milliseconds
from ._sync import session as _sync_session

__all__ = ["QUEUED_FOR", "AsyncPostgresWatch", "PostgresWatch"]

QUEUED_FOR = 30.0
"""The longest a wait statement stays queued on the server (then it is queued again)."""
_WAIT = "SET lock_timeout = '{ms}ms'; SELECT pg_advisory_xact_lock_shared({key})"
"""One round trip (the simple protocol takes both statements); integers only."""
_ENDED = {"55P03", "57014"}  # lock_not_available (lock_timeout), query_canceled


class _Queued:
    """The wait statement on the watch's session, sent and read without blocking."""

    __slots__ = ("_error", "pgconn", "sent_at")

    def __init__(self, pgconn: pq.abc.PGconn, key: int) -> None:
        self.pgconn = pgconn
        self._error: str | None = None
        pgconn.send_query(_WAIT.format(ms=milliseconds(QUEUED_FOR), key=key).encode())
        # An async connection's libpq is non-blocking: a query it could not send whole
        # (never seen: it is a hundred bytes on an idle socket) is pushed out here.
        while pgconn.flush() == 1:
            select.select([], [pgconn.socket], [], 0.1)
        self.sent_at = time.monotonic()

    @property
    def socket(self) -> int:
        """The session's socket: readable when an answer arrives."""
        return self.pgconn.socket

    def outcome(self) -> str | None:
        """Read what arrived: ``None`` while the statement is queued, else how it ended --
        ``"granted"`` (the key was released), ``"ended"`` (its ``lock_timeout``, or a
        cancel) or ``"failed"`` (the session: the acquire polls)."""
        try:
            self.pgconn.consume_input()
            while not self.pgconn.is_busy():
                result = self.pgconn.get_result()
                if result is None:
                    return self._error or "granted"
                if result.status == pq.ExecStatus.FATAL_ERROR and self._error is None:
                    state = (result.error_field(pq.DiagnosticField.SQLSTATE) or b"").decode()
                    self._error = "ended" if state in _ENDED else "failed"
        except psycopg.Error:
            return "failed"
        if self.pgconn.status == pq.ConnStatus.BAD:
            return "failed"
        return None


class _WatchState:
    """What both watches share: the session, the queued statement, the outcomes."""

    def __init__(self, settings: Settings, key: int) -> None:
        self._settings = settings
        self._key = key
        self._queued: _Queued | None = None
        self.wakes = True

    def _settle(self, outcome: str | None) -> bool:
        """Whether the wait is over, given the statement's ``outcome``."""
        if outcome is None:
            if time.monotonic() - self._queued_at() > QUEUED_FOR + self._settings.health_timeout:
                outcome = "failed"  # the server did not end it: a hung server or network
            else:
                return False
        self._queued = None
        if outcome == "failed":
            self.wakes = False  # poll from now on: the tries say what is wrong
        return True

    def _queued_at(self) -> float:
        return self._queued.sent_at if self._queued is not None else time.monotonic()


class AsyncPostgresWatch(_WatchState, AsyncReleaseWatch):
    """Woken when advisory ``key`` is released, by whoever held it (see the module).

    The session is opened at the first wait (an acquire of a free name costs nothing
    more) and closed when the acquire ends. The queue is level-triggered: a release
    between the failed try and the wait grants the wait at once, so nothing is missed.
    A session that cannot be had (``max_connections`` reached) or that fails leaves
    the acquire polling; its tries report a server that cannot be asked.
    """

    def __init__(self, settings: Settings, key: int) -> None:
        super().__init__(settings, key)
        self._conn: psycopg.AsyncConnection[Any] | None = None

    async def wait(self, seconds: float) -> None:
        """Until ``key`` is free (the queued statement granted), or ``seconds``."""
        until = time.monotonic() + seconds
        queued = await self._queue()
        if queued is None:
            await super().wait(seconds)
            return
        while not self._settle(queued.outcome()) and (left := until - time.monotonic()) > 0:
            await _readable(queued.socket, left)
        if not self.wakes:
            await self._close()

    async def _queue(self) -> _Queued | None:
        if self._queued is None and self.wakes:
            try:
                if self._conn is None:
                    self._conn = await _async_session.open_connection(self._settings)
                self._queued = _Queued(self._conn.pgconn, self._key)
            except (MultilockError, psycopg.Error):  # no session to be had: poll
                self.wakes = False
                await self._close()
        return self._queued

    async def _close(self) -> None:
        """Cancel the statement still queued, read its end (within ``health_timeout``),
        close the session."""
        conn, queued, self._conn, self._queued = self._conn, self._queued, None, None
        if conn is None:
            return
        if queued is not None:
            with suppress(psycopg.Error):
                await conn.cancel_safe(timeout=self._settings.health_timeout)
                until = time.monotonic() + self._settings.health_timeout
                while queued.outcome() is None and (left := until - time.monotonic()) > 0:
                    await _readable(queued.socket, left)
        await conn.close()

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await finish_shielded(self._close())


class PostgresWatch(_WatchState, ReleaseWatch):
    """:class:`AsyncPostgresWatch` for the sync API: waits in ``poll()``."""

    def __init__(self, settings: Settings, key: int) -> None:
        super().__init__(settings, key)
        self._conn: psycopg.Connection[Any] | None = None

    def wait(self, seconds: float) -> None:
        """Until ``key`` is free (the queued statement granted), or ``seconds``."""
        until = time.monotonic() + seconds
        queued = self._queue()
        if queued is None:
            super().wait(seconds)
            return
        while not self._settle(queued.outcome()) and (left := until - time.monotonic()) > 0:
            _poll_readable(queued.socket, left)
        if not self.wakes:
            self._close()

    def _queue(self) -> _Queued | None:
        if self._queued is None and self.wakes:
            try:
                if self._conn is None:
                    self._conn = _sync_session.open_connection(self._settings)
                self._queued = _Queued(self._conn.pgconn, self._key)
            except (MultilockError, psycopg.Error):  # no session to be had: poll
                self.wakes = False
                self._close()
        return self._queued

    def _close(self) -> None:
        conn, queued, self._conn, self._queued = self._conn, self._queued, None, None
        if conn is None:
            return
        if queued is not None:
            with suppress(psycopg.Error):
                conn.cancel_safe(timeout=self._settings.health_timeout)
                until = time.monotonic() + self._settings.health_timeout
                while queued.outcome() is None and (left := until - time.monotonic()) > 0:
                    _poll_readable(queued.socket, left)
        conn.close()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._close()


async def _readable(fd: int, seconds: float) -> None:
    """Until ``fd`` is readable, or ``seconds`` have passed (on the event loop)."""
    loop = asyncio.get_running_loop()
    readable: asyncio.Future[None] = loop.create_future()
    loop.add_reader(fd, _settle_once, readable)
    try:
        with suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await readable
    finally:
        loop.remove_reader(fd)


def _poll_readable(fd: int, seconds: float) -> None:
    """Until ``fd`` is readable, or ``seconds`` have passed (blocking)."""
    readable = select.poll()
    readable.register(fd, select.POLLIN)
    readable.poll(milliseconds(seconds))


def _settle_once(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
