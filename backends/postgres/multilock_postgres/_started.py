"""The async API's hot path: acquire and release sent on the session at once, and
answered from a reader on its socket, with no task (the core's ``_start_try_acquire``,
``_start_try_acquire_many`` and ``_start_release``).

The task path (``_try_acquire``, ``_release`` in ``_async/locker.py``, each run in a
task of its own by the core for cancellation safety) costs a task and two event-loop
turns per call, and psycopg's async ``execute`` more again. Here the statement goes
out on psycopg's own libpq connection (``pgconn.send_query_prepared``, non-blocking,
as psycopg itself sends), and a reader on the socket settles the core's ``Outcome``
when the answer is in. Taken only in the common case: the session connected and idle
(its mutex free, taken without awaiting), nothing suspect to unlock first, no cut
pending. Otherwise ``None``, and the core takes the task path.

While the statement is in flight the started path holds the session's mutex, as a
round trip of the task path does: psycopg is not used meanwhile, the socket watch is
off (its reader would be replaced by ours), and the answer is read to the end, so
psycopg finds the connection idle. The bounds are the task path's: the server's
``lock_timeout`` and ``statement_timeout``, and the health check, which waits for the
mutex under its deadline and cuts the socket of a session that does not answer;
the reader then meets the end of the stream.

Anything unusual -- an error from the server, a session that ended, a cut -- is handed
to the task path's own handling, in a task, still holding the mutex: the locker's
``_try_acquire``, ``_try_acquire_many`` or ``_unlock_all`` given the error
(``failed=``), as if they had met it
themselves (suspect keys unlocked, a dead session dropped, its leases reported lost,
an acquire asked again on a new session). So the slow path runs only when something
went wrong, and behaves as it always did.

The statements are the locker's own, prepared by name on the session's first use by
this path (one extra round trip each, once), not psycopg's: psycopg's prepared statements are its
internal state.

The mixins are named so that ``scripts/async_to_sync.py`` maps each ``Async`` one to
its ``Sync`` twin, which adds nothing: the sync API waits in the caller's thread.
"""

from __future__ import annotations

import asyncio
import secrets
import struct
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import psycopg
from psycopg import pq

from multilock.backend import AsyncLeaseBase, AsyncLockerBase, Outcome, settle_in_task

from . import _sql

if TYPE_CHECKING:
    from ._async.locker import AsyncPostgresLease, AsyncPostgresLocker
    from ._sync.locker import PostgresLocker

__all__ = ["AsyncStartedLease", "AsyncStartedLocker", "SyncStartedLease", "SyncStartedLocker"]

T = TypeVar("T")

_INT8 = struct.Struct("!q")
_INT8_OID = 20
_INT8_ARRAY_OID = 1016
_ARRAY_HEAD = struct.Struct("!iiIii")  # dimensions, has nulls, element type, length, lower bound
_BINARY = (1,)
_TUPLES_OK = pq.ExecStatus.TUPLES_OK
_COMMAND_OK = pq.ExecStatus.COMMAND_OK
_IDLE = pq.TransactionStatus.IDLE


def _numbered(text: str) -> str | None:
    """``text`` with its one ``%b`` placeholder as ``$1``; ``None`` if it has any other
    ``%`` (an escaped one, say), which a plain replacement would get wrong."""
    if text.count("%") != 1 or "%b" not in text:
        return None
    return text.replace("%b", "$1")


_UNLOCK = _numbered(_sql.UNLOCK)


class _Statements:
    """The started path's prepared statements on one session."""

    __slots__ = ("conn", "lock", "lock_many", "prepared")

    def __init__(self, conn: psycopg.AsyncConnection[Any], statements: _sql.Statements) -> None:
        self.conn = conn
        # The acquire statements with ``$1``; None: this path cannot send it.
        self.lock = _numbered(statements.lock)
        self.lock_many = _numbered(statements.lock_many)
        self.prepared: set[bytes] = set()


def _bigints(data: bytes | None) -> list[Any]:
    """A binary ``bigint[]`` of one dimension (``NULL``: none), as psycopg would load it."""
    if data is None:
        return []
    dims, nulls, _, n, _ = _ARRAY_HEAD.unpack_from(data)
    if dims == 0:
        return []
    if not nulls:  # each element: its length (8), then its value
        return list(struct.unpack_from(f"!{'iq' * n}", data, _ARRAY_HEAD.size)[1::2])
    if len(data) == _ARRAY_HEAD.size + 4 * n:
        return [None] * n  # every element NULL (fences, when fencing is off)
    values: list[int | None] = []
    at = _ARRAY_HEAD.size
    for _ in range(n):
        (size,) = struct.unpack_from("!i", data, at)
        at += 4
        if size < 0:
            values.append(None)
        else:
            values.append(_INT8.unpack_from(data, at)[0])
            at += size
    return values


class _Call(Generic[T]):
    """One statement in flight, sent by the started path while it holds the session;
    ``outcome`` is settled with ``answer(result)``, or by ``recover(error)``."""

    __slots__ = (
        "_answer",
        "_error",
        "_fd",
        "_locker",
        "_loop",
        "_name",
        "_param",
        "_pgconn",
        "_preparing",
        "_recover",
        "_result",
        "_statements",
        "_writing",
        "outcome",
    )

    def __init__(
        self,
        locker: AsyncPostgresLocker,
        statements: _Statements,
        answer: Callable[[pq.abc.PGresult], T],
        recover: Callable[[psycopg.Error], Coroutine[Any, Any, T]],
    ) -> None:
        self._locker = locker
        self._statements = statements
        self._answer = answer
        self._recover = recover
        self._loop = asyncio.get_running_loop()
        self._pgconn = statements.conn.pgconn
        self._fd = -1
        self._name = b""
        self._param = b""
        self._preparing = False
        self._result: pq.abc.PGresult | None = None
        self._error: psycopg.Error | None = None
        self._writing = False
        self.outcome: Outcome[T] = Outcome(loop=self._loop)

    def start(self, name: bytes, text: str, param: bytes, oid: int = _INT8_OID) -> None:
        """Send the prepared statement ``name`` (preparing it first from ``text`` if this
        session has not yet) with the binary ``param`` of type ``oid``."""
        pgconn = self._pgconn
        self._name, self._param = name, param
        try:
            if name in self._statements.prepared:
                self._execute()
            else:
                pgconn.send_prepare(name, text.encode(), (oid,))
                self._flush()
                self._preparing = True
            self._fd = pgconn.socket
            self._loop.add_reader(self._fd, self._on_readable)
        except Exception as exc:
            self._abort(exc)

    def _execute(self) -> None:
        self._pgconn.send_query_prepared(self._name, (self._param,), _BINARY, 1)
        self._flush()

    def _flush(self) -> None:
        # Non-blocking, as psycopg sends: what the socket does not take now goes out
        # when it is writable.
        if self._pgconn.flush() and not self._writing:
            self._writing = True
            self._loop.add_writer(self._pgconn.socket, self._on_writable)

    def _on_writable(self) -> None:
        try:
            if self._pgconn.flush() == 0:
                self._writing = False
                self._loop.remove_writer(self._fd)
        except Exception as exc:
            self._abort(exc)

    def _on_readable(self) -> None:
        pgconn = self._pgconn
        try:
            pgconn.consume_input()
            while not pgconn.is_busy():
                result = pgconn.get_result()
                if result is None:
                    break  # the whole answer is in: the connection is idle again
                error = _error_of(result, self._statements.conn)
                if error is None:
                    self._result = result
                elif self._error is None:
                    self._error = error
            else:
                return  # more to come
            _hand_notifies(pgconn)
        except Exception as exc:
            self._abort(exc)
            return
        if self._error is not None:
            if isinstance(self._error, psycopg.errors.InvalidSqlStatementName):
                self._statements.prepared.discard(self._name)  # gone: prepared again next time
            self._abort(self._error)
            return
        if self._preparing:  # prepared: now the statement itself
            self._preparing = False
            self._statements.prepared.add(self._name)
            try:
                self._execute()
            except Exception as exc:
                self._abort(exc)
            return
        self._stop()
        result, self._result = self._result, None
        try:
            assert result is not None
            value = self._answer(result)
        except Exception as exc:
            self._locker._let_go()
            self.outcome.set_exception(exc)
            return
        self._locker._let_go()
        self.outcome.set_result(value)

    def _stop(self) -> None:
        if self._fd >= 0:
            self._loop.remove_reader(self._fd)
            if self._writing:
                self._writing = False
                self._loop.remove_writer(self._fd)
            self._fd = -1

    def _abort(self, error: Exception) -> None:
        """Hand over to the task path, still holding the session: ``error`` is what this
        call met. An error that is not the driver's leaves what is on the wire unknown,
        so the session is ended first: the task path then drops it (its leases reported
        lost) and asks again on a new one, as for a session that died."""
        self._stop()
        if not isinstance(error, psycopg.Error):
            self._pgconn.finish()
            error = psycopg.OperationalError(f"{type(error).__name__}: {error}")
        settle_in_task(self.outcome, self._recover(error), self._loop)


class AsyncStartedLease:
    """The release of an async ``postgresql://`` lease, sent at once when the session is
    idle (the core's ``_start_release``)."""

    __slots__ = ()
    _locker: AsyncPostgresLocker

    def _start_release(self) -> Outcome[bool] | None:
        lease: AsyncPostgresLease = self  # type: ignore[assignment]
        return self._locker._start_unlock(lease)


class AsyncStartedLocker:
    """The acquire and release of the async ``postgresql://`` locker, sent at once when
    the session is idle (the core's ``_start_try_acquire``)."""

    _started: _Statements | None = None

    def _started_rows(
        self, cursor: psycopg.AsyncCursor[Any], query: str, params: Any
    ) -> list[Any] | None:
        """``None``: the task path runs its statements with psycopg (the async API's
        hot path is the started one above, which needs no task)."""
        return None

    def _started_session(self) -> _Statements | None:
        """The session's statements, with its mutex taken: or ``None``, with nothing
        taken, when the task path must go instead."""
        locker: AsyncPostgresLocker = self  # type: ignore[assignment]
        conn = locker._conn
        if conn is None or locker._suspects or locker._severed is not None:
            return None
        if not locker._mutex.take():
            return None
        locker._watch.busy()
        statements = self._started
        if statements is None or statements.conn is not conn:
            statements = self._started = _Statements(conn, locker._statements)
        return statements

    def _start_try_acquire(self, name: str, ttl: float) -> Outcome[AsyncLeaseBase | None] | None:
        locker: AsyncPostgresLocker = self  # type: ignore[assignment]
        key = locker._keys.key(name)
        statements = self._started_session()
        if statements is None:
            return None
        if key in locker._held or statements.lock is None:
            locker._let_go()
            if statements.lock is None:
                return None
            done: Outcome[AsyncLeaseBase | None] = Outcome(loop=asyncio.get_running_loop())
            done.set_result(None)  # this session holds it: re-entry would be a second owner
            return done
        locker._ensure_ticker()  # it bounds the call (a later event loop restarts it)

        def answer(result: pq.abc.PGresult) -> AsyncPostgresLease | None:
            fence = result.get_value(0, 0)
            return locker._lease_of(name, key, None if fence is None else _INT8.unpack(fence)[0])

        def recover(error: psycopg.Error) -> Coroutine[Any, Any, AsyncLeaseBase | None]:
            return locker._try_acquire(name, ttl, error)

        call = _Call(locker, statements, answer, recover)
        call.start(b"multilock_lock", statements.lock, _INT8.pack(key))
        return call.outcome

    def _start_try_acquire_many(
        self, names: list[str], ttl: float
    ) -> Outcome[dict[str, AsyncLeaseBase | None]] | None:
        if len(names) == 1:  # the core's default: through _start_try_acquire
            return AsyncLockerBase._start_try_acquire_many(self, names, ttl)  # type: ignore[arg-type]
        locker: AsyncPostgresLocker = self  # type: ignore[assignment]
        keys = [locker._keys.key(name) for name in names]
        statements = self._started_session()
        if statements is None:
            return None
        # Asked once per distinct key not held here, as by _try_acquire_many.
        wanted = [k for k in dict.fromkeys(keys) if k not in locker._held]
        if not wanted or statements.lock_many is None:
            locker._let_go()
            if statements.lock_many is None:
                return None
            done: Outcome[dict[str, AsyncLeaseBase | None]] = Outcome(
                loop=asyncio.get_running_loop()
            )
            done.set_result(locker._grant_many(names, keys, {}))  # all held here already
            return done
        locker._ensure_ticker()

        def answer(result: pq.abc.PGresult) -> dict[str, AsyncLeaseBase | None]:
            got = _bigints(result.get_value(0, 0))
            granted = dict(zip(got, _bigints(result.get_value(0, 1)), strict=True))
            try:
                return locker._grant_many(names, keys, granted)
            except BaseException:
                # Granted, then not tracked: unlocked before the next statement.
                locker._suspects.update(key for key in granted if key not in locker._held)
                raise

        def recover(error: psycopg.Error) -> Coroutine[Any, Any, dict[str, AsyncLeaseBase | None]]:
            return locker._try_acquire_many(names, ttl, error)

        call = _Call(locker, statements, answer, recover)
        param = _sql.bigint_array(wanted)
        call.start(b"multilock_lock_many", statements.lock_many, param, _INT8_ARRAY_OID)
        return call.outcome

    def _start_unlock(self, lease: AsyncPostgresLease) -> Outcome[bool] | None:
        """``lease``'s release, started (see :meth:`_start_try_acquire`)."""
        locker: AsyncPostgresLocker = self  # type: ignore[assignment]
        if _UNLOCK is None:
            return None
        statements = self._started_session()
        if statements is None:
            return None
        if locker._held.get(lease.key) is not lease:
            locker._let_go()
            done: Outcome[bool] = Outcome(loop=asyncio.get_running_loop())
            done.set_result(False)  # lost with its session: nothing to free
            return done

        def answer(result: pq.abc.PGresult) -> bool:
            return locker._unlocked([lease], [(result.get_value(0, 0) == b"\x01",)]) == 1

        async def recover(error: psycopg.Error) -> bool:
            return await locker._unlock_all([lease], error) == 1

        call = _Call(locker, statements, answer, recover)
        call.start(b"multilock_unlock", _UNLOCK, _INT8.pack(lease.key))
        return call.outcome


class SyncStartedLease:
    """The sync twin of :class:`AsyncStartedLease`: nothing (a sync release just waits)."""

    __slots__ = ()


class _Plan:
    """How the sync path runs one statement: its prepared name, the parameter's type,
    and how its one row is read."""

    __slots__ = ("load", "name", "oid", "prepare")

    def __init__(
        self, name: str, text: str, oid: int, load: Callable[[pq.abc.PGresult], list[Any]]
    ) -> None:
        self.name = name.encode()
        kind = "int8" if oid == _INT8_OID else "int8[]"
        self.prepare = f"PREPARE {name} ({kind}) AS {text}"
        self.oid = oid
        self.load = load


def _fence(result: pq.abc.PGresult) -> list[Any]:
    value = result.get_value(0, 0)
    return [(None if value is None else _INT8.unpack(value)[0],)]


def _granted(result: pq.abc.PGresult) -> list[Any]:
    return [(_bigints(result.get_value(0, 0)), _bigints(result.get_value(0, 1)))]


def _freed(result: pq.abc.PGresult) -> list[Any]:
    return [(result.get_value(row, 0) == b"\x01",) for row in range(result.ntuples)]


class _SyncSession:
    """The sync path's statements on one session, prepared together. Their names are
    drawn anew for each session: a pool in session mode may hand over a server session
    still holding another client's statements (when it resets none), under the same
    names but perhaps not the same text (fencing or not)."""

    __slots__ = ("conn", "plans")

    def __init__(self, conn: psycopg.Connection[Any], statements: _sql.Statements) -> None:
        self.conn = conn
        self.plans: dict[str, _Plan] = {}
        suffix = secrets.token_hex(6)
        for query, name, oid, load in (
            (statements.lock, "lock", _INT8_OID, _fence),
            (statements.lock_many, "lock_many", _INT8_ARRAY_OID, _granted),
            (_sql.UNLOCK, "unlock", _INT8_OID, _freed),
            (_sql.UNLOCK_MANY, "unlock_many", _INT8_ARRAY_OID, _freed),
        ):
            text = _numbered(query)
            if text is not None:
                self.plans[query] = _Plan(f"multilock_{name}_{suffix}", text, oid, load)

    def prepare(self) -> None:
        """Prepare every plan, in one round trip (a pipeline)."""
        with self.conn.pipeline():
            for plan in self.plans.values():
                self.conn.execute(plan.prepare)


class SyncStartedLocker:
    """The sync API's hot path: the acquire and release statements run on psycopg's own
    libpq connection (``pgconn.exec_prepared``, which waits without the GIL), their one
    row read by hand -- half the client CPU of psycopg's ``execute`` and ``fetchall``
    (docs/decisions.md). They are prepared together, by name, in one round trip when
    a session first runs one (it is connecting then: the round trip is added to the
    connection's own). An error is raised as psycopg's, so the locker's round trip
    (``_ask``) handles it as it handles psycopg's own."""

    _sync_session: _SyncSession | None = None

    def _started_rows(
        self, cursor: psycopg.Cursor[Any], query: str, params: Any
    ) -> list[Any] | None:
        """The rows of ``query`` run with ``params``, or ``None`` when psycopg must run it
        (not one of the hot statements, or the session is not idle)."""
        conn = cursor.connection
        pgconn = conn.pgconn
        if pgconn.transaction_status != _IDLE:
            return None
        session = self._sync_session
        if session is None or session.conn is not conn:
            locker: PostgresLocker = self  # type: ignore[assignment]
            session = _SyncSession(conn, locker._statements)
            session.prepare()
            self._sync_session = session
        plan = session.plans.get(query)
        if plan is None:
            return None
        (param,) = params
        data = _INT8.pack(param) if plan.oid == _INT8_OID else bytes(param)
        result = _run(pgconn, plan, data)
        error = _error_of(result, conn)
        if isinstance(error, psycopg.errors.InvalidSqlStatementName):
            # Deallocated on the session (by a DEALLOCATE or DISCARD ALL): nothing ran.
            session.prepare()
            result = _run(pgconn, plan, data)
            error = _error_of(result, conn)
        if error is not None:
            raise error
        return plan.load(result)


def _run(pgconn: pq.abc.PGconn, plan: _Plan, data: bytes) -> pq.abc.PGresult:
    result = pgconn.exec_prepared(plan.name, (data,), _BINARY, 1)
    _hand_notifies(pgconn)
    return result


def _hand_notifies(pgconn: pq.abc.PGconn) -> None:
    """Hand the notifications that came with an answer to psycopg's handler, as psycopg
    does after each answer it reads."""
    handler = pgconn.notify_handler
    if handler is not None:
        while notify := pgconn.notifies():
            handler(notify)


def _error_of(
    result: pq.abc.PGresult, conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]
) -> psycopg.Error | None:
    """psycopg's error for a result that is not an answer; ``None`` for an answer."""
    if result.status == _TUPLES_OK or result.status == _COMMAND_OK:
        return None
    return psycopg.errors.error_from_result(result, encoding=conn.info.encoding)
