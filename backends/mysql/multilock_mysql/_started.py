"""The async API's hot path: acquire and release written on the session at once, and
answered from the session's protocol, with no task (the core's ``_start_try_acquire``,
``_start_try_acquire_many`` and ``_start_release``).

The task path (``_try_acquire``, ``_release`` in ``_async/locker.py``, each run in a
task of its own by the core for cancellation safety) costs a task and two event-loop
turns per call, and aiomysql's coroutines more again. Here the statement is written on
aiomysql's own transport, as aiomysql writes a command, and the protocol that already
stands in front of aiomysql's (``Hangup``, which tells the watch when the server hangs
up) hands what arrives to this call instead (its ``tap``); the call reads the answer
packet by packet (``Answer``, as the task path does) and settles the core's
``Outcome``. Taken only in the common case: the session connected on this event loop
and idle (its mutex free, taken without awaiting), nothing suspect to unlock first, no
fencing (its three statements take the task path). Otherwise ``None``, and the core
takes the task path.

While the statement is in flight the started path holds the session's mutex, as a
round trip of the task path does, and the answer is read to its last packet, so
aiomysql finds the session idle afterwards. The bound is the task path's: the session
guard's timer, entered and left here as ``async with guard`` would, cuts a session
that does not answer in time; the call then sees the connection end.

Anything unusual -- an error from the server, a session that ended, a cut -- is handed
to the task path's own handling, in a task, still holding the mutex: the locker's
``_try_acquire``, ``_try_acquire_many`` or ``_unlock`` given the error (``failed=``),
as if they had met it themselves (the key suspect, a dead session dropped and its
leases reported lost, an acquire asked again on a new session, a cut session failing
with the cut's reason) -- the same code, not a copy.

The mixins are named so that ``scripts/async_to_sync.py`` maps each ``Async`` one to
its ``Sync`` twin, which adds nothing: the sync API waits in the caller's thread.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from pymysql.constants import COMMAND, CR
from pymysql.err import InternalError, MySQLError, OperationalError
from pymysql.protocol import MysqlPacket

from multilock.backend import AsyncLeaseBase, AsyncLockerBase, Outcome, new_token, settle_in_task

from . import _sql
from ._runtime import Answer, Hangup, Row, Tap

if TYPE_CHECKING:
    from ._async.locker import AsyncMySQLLease, AsyncMySQLLocker

__all__ = ["AsyncStartedLease", "AsyncStartedLocker", "SyncStartedLease", "SyncStartedLocker"]

T = TypeVar("T")

_COMMAND = struct.Struct("<iB")  # a packet's length (3 bytes) and number (0), the command
_LONGEST = 0xFFFFFF - 1  # a statement longer than one packet takes the task path
_LOST = "Lost connection to MySQL server during query"  # aiomysql's words


class _Call(Tap, Generic[T]):
    """One statement in flight, written by the started path while it holds the session;
    ``outcome`` is settled with ``answer(row)``, or by ``recover(error)``."""

    __slots__ = (
        "_answer",
        "_buffer",
        "_conn",
        "_locker",
        "_loop",
        "_protocol",
        "_read",
        "_recover",
        "_seq",
        "outcome",
    )

    def __init__(
        self,
        locker: AsyncMySQLLocker,
        protocol: Hangup,
        answer: Callable[[Row], T],
        recover: Callable[[BaseException], Coroutine[Any, Any, T]],
    ) -> None:
        self._locker = locker
        self._conn = locker._conn
        self._protocol = protocol
        self._answer = answer
        self._recover = recover
        self._loop = asyncio.get_running_loop()
        self._buffer = b""
        self._read = Answer()
        self._seq = 1  # the number of the next packet from the server
        self.outcome: Outcome[T] = Outcome(loop=self._loop)

    def start(self, query: bytes) -> None:
        """Write ``query`` on the session, as aiomysql's ``_execute_command`` does."""
        locker = self._locker
        locker._guard.until(locker._settings.timeout, self._conn).enter(self._loop)
        self._protocol.tap = self
        try:
            self._conn._write_bytes(_COMMAND.pack(len(query) + 1, COMMAND.COM_QUERY) + query)
        except Exception as exc:
            self._abort(exc)

    def received(self, data: bytes) -> None:
        buffer = self._buffer + data if self._buffer else data
        at, end = 0, len(buffer)
        try:
            while end - at >= 4:
                size = buffer[at] | buffer[at + 1] << 8 | buffer[at + 2] << 16
                if end - at - 4 < size:
                    break
                number = buffer[at + 3]
                if number != self._seq or size == 0xFFFFFF:
                    self._conn.close()  # as aiomysql does: the stream is out of step
                    if number == 0:  # the server's farewell (a shutdown, a KILL)
                        raise OperationalError(CR.CR_SERVER_LOST, _LOST)
                    raise InternalError(f"packet number {number}, expected {self._seq}")
                self._seq = (self._seq + 1) % 256
                packet = MysqlPacket(buffer[at + 4 : at + 4 + size], self._conn._encoding)
                at += 4 + size
                if packet.is_error_packet():
                    packet.raise_for_error()  # the answer ends there
                if self._read.feed(packet):
                    self._done(buffer[at:])
                    return
        except Exception as exc:
            self._abort(exc)
            return
        self._buffer = buffer[at:]

    def ended(self, exc: Exception | None) -> None:
        self._conn.close()  # as aiomysql does when a read meets the end of the stream
        self._abort(OperationalError(CR.CR_SERVER_LOST, _LOST))

    def _stop(self) -> None:
        self._protocol.tap = None
        self._locker._guard.leave()

    def _done(self, rest: bytes) -> None:
        self._stop()
        conn = self._conn
        conn._next_seq_id = self._seq
        conn.server_status = self._read.status
        if rest:  # nothing should follow an answer; aiomysql would see it, so it does
            self._protocol.pass_on(rest)
        try:
            value = self._answer(self._read.row)
        except BaseException as exc:
            self._locker._mutex.release()
            self.outcome.set_exception(exc)
            return
        self._locker._mutex.release()
        self.outcome.set_result(value)

    def _abort(self, error: BaseException) -> None:
        """Hand over to the task path, still holding the session: ``error`` is what this
        call met. An error that is not the driver's leaves what is on the wire unknown,
        so the session is closed first: the task path then drops it (its leases reported
        lost) and asks again on a new one, as for a session that died."""
        self._stop()
        if not isinstance(error, MySQLError):
            self._conn.close()
            error = OperationalError(CR.CR_SERVER_LOST, f"{type(error).__name__}: {error}")
        settle_in_task(self.outcome, self._recover(error), self._loop)


def _done(value: T) -> Outcome[T]:
    """An outcome settled already: answered without a round trip."""
    outcome: Outcome[T] = Outcome(loop=asyncio.get_running_loop())
    outcome.set_result(value)
    return outcome


class AsyncStartedLease:
    """The release of an async ``mysql://`` lease, written at once when the session is
    idle (the core's ``_start_release``)."""

    __slots__ = ()
    _locker: AsyncMySQLLocker

    def _start_release(self) -> Outcome[bool] | None:
        lease: AsyncMySQLLease = self  # type: ignore[assignment]
        return self._locker._start_unlock(lease)


class AsyncStartedLocker:
    """The acquire and release of the async ``mysql://`` locker, written at once when
    the session is idle (the core's ``_start_try_acquire``)."""

    def _started_session(self) -> Hangup | None:
        """The session's protocol, with its mutex taken: or ``None``, with nothing
        taken, when the task path must go instead."""
        locker: AsyncMySQLLocker = self  # type: ignore[assignment]
        conn = locker._conn
        protocol = locker._watch.protocol
        if (
            conn is None
            or protocol is None
            or locker._suspects
            or locker._settings.fence is not None
            or conn.closed
            or conn._loop is not asyncio.get_running_loop()
            or not locker._mutex.take()
        ):
            return None
        return protocol

    def _start_try_acquire(self, name: str, ttl: float) -> Outcome[AsyncLeaseBase | None] | None:
        locker: AsyncMySQLLocker = self  # type: ignore[assignment]
        key = locker._keys.key(name)
        protocol = self._started_session()
        if protocol is None:
            return None
        if key in locker._held:
            locker._mutex.release()
            return _done(None)  # this session holds it: re-entry would be a second owner

        def answer(row: Row) -> AsyncMySQLLease | None:
            if row[0] != b"1":
                return None
            return locker._grant(name, key, new_token(), None, datetime.now(UTC))

        def recover(error: BaseException) -> Coroutine[Any, Any, AsyncLeaseBase | None]:
            return locker._try_acquire(name, ttl, error)

        return self._send(protocol, _sql.lock(key), [key], answer, recover)

    def _start_try_acquire_many(
        self, names: list[str], ttl: float
    ) -> Outcome[dict[str, AsyncLeaseBase | None]] | None:
        if len(names) == 1:  # the core's default: through _start_try_acquire
            return AsyncLockerBase._start_try_acquire_many(self, names, ttl)  # type: ignore[arg-type]
        locker: AsyncMySQLLocker = self  # type: ignore[assignment]
        keys = [locker._keys.key(name) for name in names]
        protocol = self._started_session()
        if protocol is None:
            return None
        wanted = [key for key in keys if key not in locker._held]
        if not wanted:
            locker._mutex.release()
            return _done(locker._grant_many(names, keys, {}))  # all held here already

        def answer(row: Row) -> dict[str, AsyncLeaseBase | None]:
            granted = _sql.answers(row[0], len(wanted))
            won: dict[str, int | None] = {
                k: None for k, g in zip(wanted, granted, strict=True) if g
            }
            return locker._grant_many(names, keys, won)

        def recover(error: BaseException) -> Coroutine[Any, Any, dict[str, AsyncLeaseBase | None]]:
            return locker._try_acquire_many(names, ttl, error)

        return self._send(protocol, _sql.lock_many(wanted), wanted, answer, recover)

    def _start_unlock(self, lease: AsyncMySQLLease) -> Outcome[bool] | None:
        """``lease``'s release, started (see :meth:`_start_try_acquire`)."""
        locker: AsyncMySQLLocker = self  # type: ignore[assignment]
        protocol = self._started_session()
        if protocol is None:
            return None
        if locker._held.get(lease.key) is not lease:
            locker._mutex.release()
            return _done(False)  # lost with its session: nothing to free

        def answer(row: Row) -> bool:
            return locker._unlocked([lease.key], row[0]) == 1

        async def recover(error: BaseException) -> bool:
            return await locker._unlock([lease], error) == 1

        return self._send(protocol, _sql.unlock(lease.key), [], answer, recover)

    def _send(
        self,
        protocol: Hangup,
        query: str,
        asked: list[str],
        answer: Callable[[Row], T],
        recover: Callable[[BaseException], Coroutine[Any, Any, T]],
    ) -> Outcome[T] | None:
        """Write ``query`` (the mutex taken); should the answer to an acquire of the keys
        ``asked`` be lost to a failure once read, they are suspect (see ``_lock``)."""
        locker: AsyncMySQLLocker = self  # type: ignore[assignment]
        data = query.encode()
        if len(data) > _LONGEST:
            locker._mutex.release()
            return None

        def answered(row: Row) -> T:
            try:
                return answer(row)
            except BaseException:
                # Granted, maybe, then not tracked: unlocked before the next statement.
                locker._suspects.update(key for key in asked if key not in locker._held)
                raise

        call = _Call(locker, protocol, answered, recover)
        call.start(data)
        return call.outcome


class SyncStartedLease:
    """The sync twin of :class:`AsyncStartedLease`: nothing (a sync release just waits)."""

    __slots__ = ()


class SyncStartedLocker:
    """The sync twin of :class:`AsyncStartedLocker`: nothing (a sync acquire just waits)."""
