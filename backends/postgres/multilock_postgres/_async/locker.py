"""The PostgreSQL locker: advisory locks on one dedicated session connection.

One connection per locker holds every lease of that locker; it is never
pooled and runs in autocommit, so a lock lives exactly as long as the session.
Advisory locks are re-entrant per session, so the locker tracks what it holds
by key: a second acquirer of a held key in this process gets ``None``, and each
key is unlocked exactly once. Every use of the connection is serialized by one
mutex, held only across a single round trip (or a connect).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from functools import partial
from operator import attrgetter
from typing import Any

import psycopg
from psycopg import pq
from psycopg.types.numeric import Int8

from multilock.backend import AsyncLeaseBase, AsyncLockerBase, Capability, LockInfo, LockURL
from multilock.backend import new_token as _new_token
from multilock.errors import BackendUnavailable, ClaimsUnavailable, InvalidLockName, MultilockError

from .. import _sql
from .._config import Settings, parse_settings
from .._errors import driver_error
from .._runtime import (
    AsyncDeadline,
    AsyncMutex,
    AsyncSocketWatch,
    AsyncTicker,
    Cut,
    KeyCache,
    readable,
)
from .._started import AsyncStartedLease, AsyncStartedLocker
from .._wait import AsyncPostgresWatch
from . import session as _session

__all__ = ["AsyncPostgresLease", "AsyncPostgresLocker"]

_log = logging.getLogger("multilock.postgres")

_Lost = list[tuple["AsyncPostgresLease", str]]
"""Leases whose session died, with the reason: fired once the mutex is released."""
_Query = str | Callable[[_sql.Statements], str]
"""A statement, or how to pick it from the session's acquire statements (which name
the fencing sequence as the session found it)."""
_LOCK: Callable[[_sql.Statements], str] = attrgetter("lock")
_LOCK_MANY: Callable[[_sql.Statements], str] = attrgetter("lock_many")

_CAPABILITIES = frozenset(
    {
        Capability.SESSION,
        Capability.CROSS_PROCESS,
        Capability.CROSS_HOST,
        Capability.LOST_SIGNAL,
        Capability.INTROSPECTION,
        Capability.BATCH,
        Capability.TICK_CLAIM,
    }
)


class AsyncPostgresLease(AsyncStartedLease, AsyncLeaseBase):
    """A session advisory lock. ``expires_at`` is ``None``: it lasts as long as the
    session, and ``extend()`` only checks that the session is alive."""

    __slots__ = ("_locker", "acquired_at")

    key: int
    _locker: AsyncPostgresLocker
    acquired_at: datetime
    """When the server granted the lock (local clock, UTC)."""

    async def _release(self) -> bool:
        return await self._locker._unlock(self)

    async def _extend(self, ttl: float | None) -> float | None:
        await self._locker._check_alive(self)
        return None


class AsyncPostgresLocker(AsyncStartedLocker, AsyncLockerBase):
    """Locks of a ``postgresql://`` URL, taken with ``pg_try_advisory_lock``."""

    max_name_length = None
    claim_retention: float | None = None  # rows of the claims table are never deleted

    def __init__(self, url: LockURL) -> None:
        settings = parse_settings(url)
        super().__init__(url, default_ttl=settings.ttl)
        self._settings: Settings = settings
        self._statements = _sql.statements(None)  # fenced ones are made once connected
        fencing = {Capability.FENCING} if settings.fencing_sequence else set()
        self.capabilities = _CAPABILITIES | fencing
        self._mutex = AsyncMutex()
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._cursor: psycopg.AsyncCursor[Any] | None = None
        self._pid: int | None = None
        self._held: dict[int, AsyncPostgresLease] = {}
        self._suspects: set[int] = set()
        self._prepared: set[str] = set()
        self._severed: str | None = None  # why the health check cut the session off
        self._keys = KeyCache()
        self._ticker: AsyncTicker | None = None
        self._watch = AsyncSocketWatch(self._mutex, self._on_socket, "multilock-postgres-watch")
        self._holding = _Holding(self)
        self._claims = _sql.claim_statements(settings.claims_table)
        self._claims_ready = False  # the claims table is known to be there, and ours to write

    @property
    def session_pid(self) -> int | None:
        """The server process id of the session holding the leases (``None`` when
        not connected): what ``pg_terminate_backend`` would end."""
        return self._pid

    # -- acquiring ----------------------------------------------------------------------

    async def _try_acquire(
        self, name: str, ttl: float, failed: psycopg.Error | None = None
    ) -> AsyncPostgresLease | None:
        """``failed``: the started path (``_started.py``) sent this acquire, holding the
        session, and met this error: handled here as if this call had met it."""
        key = self._keys.key(name)
        lost: _Lost = []
        try:
            async with self._holding if failed is None else _Holding(self, taken=True):
                if key in self._held:
                    return None  # this session holds it: re-entry would be a second owner
                rows = await self._ask_lock(_LOCK, (Int8(key),), [key], lost, failed)
                return self._lease_of(name, key, rows[0][0])
        finally:
            _fire(lost)

    def _lease_of(self, name: str, key: int, fence: int | None) -> AsyncPostgresLease | None:
        """The lease an acquire statement's answer ``fence`` grants (``0``: none)."""
        if fence == 0:
            return None
        lease = self._grant(name, key, _new_token(), fence, datetime.now(UTC))
        self._ensure_ticker()  # the lease is tracked: close() frees it, come what may
        return lease

    async def _try_acquire_many(
        self, names: list[str], ttl: float, failed: psycopg.Error | None = None
    ) -> dict[str, AsyncLeaseBase | None]:
        """``failed``: as for :meth:`_try_acquire`."""
        keys = [self._keys.key(name) for name in names]
        lost: _Lost = []
        try:
            async with self._holding if failed is None else _Holding(self, taken=True):
                # Ask once per distinct key not held here: a key twice in one batch
                # would be granted twice by the re-entrant session lock.
                wanted = [k for k in dict.fromkeys(keys) if k not in self._held]
                granted: dict[int, int | None] = {}
                if wanted:
                    params = (_sql.bigint_array(wanted),)
                    rows = await self._ask_lock(_LOCK_MANY, params, wanted, lost, failed)
                    got, fences = rows[0]
                    if got:
                        granted = dict(zip(got, fences, strict=True))
                try:
                    return self._grant_many(names, keys, granted)
                except BaseException:
                    # Granted, then not tracked: unlocked now (or before the next statement).
                    self._suspects.update(key for key in granted if key not in self._held)
                    await self._unlock_suspects_now()
                    raise
        finally:
            _fire(lost)

    def _grant_many(
        self, names: list[str], keys: list[int], granted: dict[int, int | None]
    ) -> dict[str, AsyncLeaseBase | None]:
        # Granted by one statement: one timestamp serves the whole batch, and one owner
        # token, made unique per lease by its position (a new_token() per lease costs
        # about 1 us: as much as all the rest of a grant).
        now, batch = datetime.now(UTC), _new_token()
        result: dict[str, AsyncLeaseBase | None] = {}
        for i, (name, key) in enumerate(zip(names, keys, strict=True)):
            if key in granted and key not in self._held:
                result[name] = self._grant(name, key, f"{batch}.{i:x}", granted[key], now)
            else:
                result[name] = None
        if granted:
            self._ensure_ticker()
        return result

    def _grant(
        self, name: str, key: int, token: str, fence: int | None, acquired_at: datetime
    ) -> AsyncPostgresLease:
        lease = AsyncPostgresLease(name, key, token, fence)
        lease._locker = self
        lease.acquired_at = acquired_at
        self._held[key] = lease
        return lease

    def _ensure_ticker(self) -> None:
        """Start the health check with the first session (and again in a later event
        loop, for the async locker): it bounds a call stuck on the session, leases held
        or not, and checks the session while leases are held."""
        if self._ticker is None:
            interval = self._settings.health_interval
            self._ticker = AsyncTicker(interval, self._health_check, "multilock-postgres-health")
        else:
            self._ticker.ensure_running()

    # -- tick claims --------------------------------------------------------------------

    async def _claim_ticks(self, names: list[str], fires: list[int]) -> list[bool]:
        """One ``INSERT ... ON CONFLICT ... WHERE ... RETURNING`` for the whole batch (the
        first claim of a locker makes sure of the table first: see :meth:`_claims_table`)."""
        for name in names:
            if "\x00" in name:
                raise InvalidLockName("a tick claim's name cannot hold NUL on PostgreSQL")
        lost: _Lost = []
        try:
            async with self._holding:
                if not self._claims_ready:
                    await self._claims_table(lost)
                params = (names, [Int8(fire) for fire in fires])
                rows = await self._ask(self._claims.claim, params, lost, "claiming ticks")
        finally:
            _fire(lost)
        won = {row[0] for row in rows}
        return [name in won for name in names]

    async def _claims_table(self, lost: _Lost) -> None:
        """Make sure the claims table exists (``CREATE TABLE IF NOT EXISTS``, racing other
        lockers harmlessly) and that this role may write it; else
        :class:`ClaimsUnavailable`, saying what an administrator can run. Caller holds
        the mutex."""
        doing = "preparing the tick claims table"
        rows = await self._ask(self._claims.usable, None, lost, doing)
        exists, writable = rows[0]
        table, url = self._claims.table, self._settings.url
        fix = (
            f" Have an administrator run: {self._claims.create};"
            f" GRANT SELECT, INSERT, UPDATE ON {table} TO <role>. Until then the scheduler"
            " holds its jobs' locks instead (exactly once only within skew_tolerance)."
        )
        if not exists:
            conn = self._conn
            assert conn is not None
            try:
                await _session.answer(conn, self._settings, doing, self._claims.create)
            except (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateTable):
                pass  # made meanwhile by another locker
            except psycopg.errors.InsufficientPrivilege as exc:
                raise ClaimsUnavailable(
                    f"PostgreSQL at {url.masked}: this role may not create the tick claims"
                    f" table {table!r} ({_reason(exc)}).{fix}"
                ) from None
            except psycopg.Error as exc:
                raise driver_error(url, exc, doing) from None
            rows = await self._ask(self._claims.usable, None, lost, doing)
            exists, writable = rows[0]
        if not writable:
            raise ClaimsUnavailable(
                f"PostgreSQL at {url.masked}: this role may not read and write the tick"
                f" claims table {table!r}.{fix}"
            )
        self._claims_ready = True

    def watch_released(self, name: str) -> AsyncPostgresWatch:
        """A session of the waiter's own, queued for the key until it is released."""
        return AsyncPostgresWatch(self._settings, self._keys.key(name))

    # -- releasing ----------------------------------------------------------------------

    async def _unlock(self, lease: AsyncPostgresLease) -> bool:
        return await self._unlock_all([lease]) == 1

    async def _release_leases(self, leases: list[AsyncLeaseBase]) -> None:
        """Free ``leases`` in one round trip (``pg_advisory_unlock`` over an array)."""
        await self._unlock_all([lease for lease in leases if isinstance(lease, AsyncPostgresLease)])

    async def _unlock_all(
        self, leases: list[AsyncPostgresLease], failed: psycopg.Error | None = None
    ) -> int:
        """Unlock, in one round trip, those of ``leases`` the session still holds (one lost
        with its session, or never ours, has nothing to free); how many the server freed.
        ``failed``: as for :meth:`_try_acquire`."""
        lost: _Lost = []
        try:
            async with self._holding if failed is None else _Holding(self, taken=True):
                held = [lease for lease in leases if self._held.get(lease.key) is lease]
                if not held:
                    return 0
                one = len(held) == 1
                params: Sequence[Any]
                if one:  # the hot path: a plain bigint, no array to build
                    query, params = _sql.UNLOCK, (Int8(held[0].key),)
                else:
                    query, params = (
                        _sql.UNLOCK_MANY,
                        (_sql.bigint_array([lease.key for lease in held]),),
                    )
                try:
                    rows = await self._ask(
                        query, params, lost, "release", reconnect=False, failed=failed
                    )
                except MultilockError as exc:
                    # A dead session took the locks with it. A live one that failed to
                    # answer keeps the keys tracked, to be unlocked on close.
                    _log.warning("releasing advisory %s: %s", _keys_shown(held), exc)
                    return 0
                return self._unlocked(held, rows)
        finally:
            _fire(lost)

    def _unlocked(self, held: list[AsyncPostgresLease], rows: list[Any]) -> int:
        """Forget ``held``, which the unlock statement answered with ``rows``; how many
        the server freed."""
        for lease in held:
            del self._held[lease.key]
        freed = sum(1 for (done,) in rows if done)
        if freed != len(held):
            missing = len(held) - freed
            _log.error("advisory %s: %d not held by the session", _keys_shown(held), missing)
        return freed

    # -- health -------------------------------------------------------------------------

    async def _check_alive(self, lease: AsyncPostgresLease) -> None:
        """One round trip on the session: if it is dead, the lease is reported lost."""
        lost: _Lost = []
        try:
            async with self._holding:
                if self._held.get(lease.key) is lease:
                    try:
                        await self._ask(_sql.PING, None, lost, "extend", reconnect=False)
                    except MultilockError:
                        if self._held.get(lease.key) is lease:
                            raise  # the session lives on but could not answer
        finally:
            _fire(lost)
        lease._check_extendable()

    async def _health_check(self) -> None:
        """Every ``health_interval``: with leases held, one ``SELECT 1`` on the session.

        The whole check -- waiting for the mutex included, so a caller stuck in a
        round trip counts -- runs under a deadline of ``health_timeout``: a session
        that does not answer in time is cut off and its leases reported lost, even
        where TCP would not notice (a hung server or proxy). The server gives up on a
        statement sooner (``statement_timeout``, ``lock_timeout``), so a round trip
        of a live session is answered in time. It runs from the first connect, leases
        or not: no call on the session blocks past ``health_interval`` +
        ``health_timeout``."""
        conn = self._conn
        if conn is None:
            return
        lost: _Lost = []
        try:
            deadline = AsyncDeadline(self._settings.health_timeout, partial(self._sever, conn))
            async with _Holding(self, deadline):
                if self._held and self._conn is conn:
                    await self._ask(_sql.PING, None, lost, "health check", reconnect=False)
        except MultilockError as exc:
            _log.debug("PostgreSQL session health check: %s", exc)
        finally:
            _fire(lost)

    def _sever(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """The health check's deadline on session ``conn`` passed. The mutex may be held
        by a stuck round trip (on another thread, for the sync locker), so this only
        shuts the socket down -- the stuck call then fails and drops the session -- and
        reports the leases lost. Nothing, if the session was replaced meanwhile."""
        if self._conn is not conn:
            return
        timeout = self._settings.health_timeout
        reason = f"the PostgreSQL session did not answer within {timeout:g} s"
        # Recorded before the cut: the stuck call wakes as soon as the socket is shut
        # and must see why, or it would reconnect through the same hung path.
        self._severed = reason
        Cut(conn, timeout)()
        _fire([(lease, reason) for lease in list(self._held.values())])

    async def _on_socket(self) -> None:
        """The idle session's socket has something to read: most likely the server's
        last words before it closes the session. If so, its leases are lost now, not at
        the next health check."""
        lost: _Lost = []
        try:
            async with self._holding:
                conn = self._conn
                if conn is not None and self._held:
                    reason = _ended(conn)
                    if reason is not None:
                        lost += await self._drop_session(reason)
        finally:
            _fire(lost)

    # -- the session --------------------------------------------------------------------

    async def _ask(
        self,
        query: _Query,
        params: Sequence[Any] | None,
        lost: _Lost,
        doing: str,
        *,
        reconnect: bool = True,
        failed: psycopg.Error | None = None,
    ) -> list[Any]:
        """One round trip on the session, connecting first if needed. Caller holds
        the mutex. If an established session turns out dead, its leases go to
        ``lost`` and, when ``reconnect``, the query is asked once more on a new
        session: the old session's locks died with it, so nothing is granted twice.
        ``failed``: the error the started path met asking it on this session."""
        retry = reconnect
        while True:
            cursor = self._cursor
            if cursor is None:
                if not reconnect:
                    raise BackendUnavailable(f"PostgreSQL at {self.url}: not connected")
                cursor = await self._connect()
                retry = False
            try:
                if failed is not None:
                    error, failed = failed, None
                    raise error
                if self._suspects:
                    await self._unlock_suspects(cursor)
                text = query if isinstance(query, str) else query(self._statements)
                rows = self._started_rows(cursor, text, params)  # the sync API's hot path
                if rows is None:
                    await self._execute(cursor, text, params)
                    rows = await cursor.fetchall()
                return rows
            except psycopg.Error as exc:
                conn = self._conn
                if conn is not None and not conn.closed and not conn.broken:
                    raise driver_error(self._settings.url, exc, doing) from None
                # A session cut off for not answering is not retried: a new one would
                # most likely hang the same way, for a whole connect_timeout.
                severed, self._severed = self._severed, None
                reason = severed or f"the PostgreSQL session ended: {_reason(exc)}"
                lost += await self._drop_session(reason)
                if severed:
                    raise BackendUnavailable(
                        f"PostgreSQL at {self.url}: {doing}: {severed}"
                    ) from None
                if not retry:
                    raise driver_error(self._settings.url, exc, doing) from None
                retry = False

    async def _execute(
        self, cursor: psycopg.AsyncCursor[Any], query: str, params: Sequence[Any] | None
    ) -> None:
        """Run a prepared statement: one round trip, the first one included (in a
        pipeline, the Parse travels with the Bind and Execute)."""
        if query in self._prepared:
            await cursor.execute(query, params, prepare=True)
            return
        pipeline = cursor.connection.pipeline()
        await pipeline.__aenter__()
        try:
            await cursor.execute(query, params, prepare=True)
        except BaseException:
            # Not `async with`: on a dead session, ending the pipeline fails too, and
            # psycopg would log that ("error ignored terminating <psycopg.Pipeline
            # [BAD]>") to stderr. The error raised here says all there is to say.
            try:
                await pipeline.__aexit__(None, None, None)
            except psycopg.Error:
                pass
            raise
        await pipeline.__aexit__(None, None, None)
        self._prepared.add(query)

    async def _ask_lock(
        self,
        query: _Query,
        params: Sequence[Any],
        keys: list[int],
        lost: _Lost,
        failed: psycopg.Error | None = None,
    ) -> list[Any]:
        """``_ask`` for an acquire statement. One that fails or is interrupted in flight
        may have been granted first (``nextval`` of the fencing sequence runs after
        ``pg_try_advisory_lock`` and may time out waiting for a lock on it; psycopg
        cancels an interrupted query the server may have run): its keys are suspect,
        unlocked at once where possible, else before the next statement."""
        try:
            return await self._ask(query, params, lost, "try_acquire", failed=failed)
        except BaseException as exc:
            if self._cursor is not None:  # else the session died, and its locks with it
                self._suspects.update(keys)
                if isinstance(exc, Exception):
                    await self._unlock_suspects_now()
            raise

    async def _unlock_suspects_now(self) -> None:
        """Unlock the suspect keys on a live session now (best effort: if that fails,
        they stay suspect for the next statement, or die with the session)."""
        cursor = self._cursor
        if cursor is not None and self._suspects:
            try:
                await self._unlock_suspects(cursor)
            except psycopg.Error as exc:
                _log.debug("unlocking suspect advisory keys: %s", exc)

    async def _unlock_suspects(self, cursor: psycopg.AsyncCursor[Any]) -> None:
        keys = [k for k in self._suspects if k not in self._held]
        if keys:
            await self._execute(cursor, _sql.UNLOCK_MANY, (_sql.bigint_array(keys),))
        self._suspects.clear()  # only once unlocked: a failure keeps them for the next try

    async def _connect(self) -> psycopg.AsyncCursor[Any]:
        settings = self._settings
        if self._closed:
            raise MultilockError(f"{self!r} is closed")
        conn = await _session.open_connection(settings)
        try:
            pid, sequence = await _session.prepare_session(conn, settings)
        except BaseException:
            await conn.close()
            raise
        conn.adapters.register_dumper(_sql.BigintArray, _sql.BigintArrayDumper)
        if sequence is not None:
            self._statements = _sql.statements(sequence)
        self._conn = conn
        self._severed = None
        self._prepared.clear()
        self._cursor = conn.cursor(binary=True)
        self._pid = pid  # the server's: behind a pooler, conn.info.backend_pid is the pooler's
        self._ensure_ticker()
        return self._cursor

    async def _drop_session(self, reason: str) -> _Lost:
        """Forget a dead session; return its leases, to be fired outside the mutex."""
        conn, self._conn, self._cursor, self._pid = self._conn, None, None, None
        leases = [(lease, reason) for lease in self._held.values()]
        self._held.clear()
        self._suspects.clear()
        if conn is not None:
            await conn.close()
        return leases

    async def _close(self) -> None:
        if self._ticker is not None:
            await self._ticker.stop()
        await self._watch.stop()
        async with self._holding:
            conn, self._conn, self._cursor, self._pid = self._conn, None, None, None
            leases = list(self._held.values())
            self._held.clear()
            for lease in leases:
                lease._released = True
            if conn is None:
                return
            try:
                if leases:
                    # Unlock before closing: the server ends a closed session a little
                    # later, and the next holder should not have to wait for that.
                    doing = "unlocking on close"
                    await _session.answer(conn, self._settings, doing, _sql.UNLOCK_ALL)
            except (psycopg.Error, MultilockError) as exc:  # the session ends anyway
                _log.debug("unlocking on close: %s", exc)
            finally:
                await conn.close()

    def _let_go(self) -> None:
        """The session is idle again: watched while leases are held, and the mutex
        released (the end of a hold: ``_Holding``, or the started path's answer)."""
        try:
            conn = self._conn
            if self._held and conn is not None and not conn.closed:
                self._watch.idle(conn.pgconn.socket)
            else:
                self._watch.clear()
        except psycopg.Error as error:  # unusable: the next call says why
            _log.debug("PostgreSQL session watch not armed: %s", error)
            self._watch.clear()
        finally:
            self._mutex.release()

    # -- introspection ------------------------------------------------------------------

    async def locks(self) -> list[LockInfo]:
        """The advisory locks held in this database, by any session.

        ``since`` is when this locker took the lock, for its own leases, and
        otherwise the holder session's ``backend_start`` (the lock was taken at
        or after it; PostgreSQL does not record when). ``name`` is known for the
        names this locker has seen; other keys show ``name=None``.
        """
        # A connection of its own: a slow catalog query must not hold up the session
        # (nor run into its health check's deadline).
        settings = self._settings
        conn = await _session.open_connection(settings)
        try:
            doing = "listing locks"
            timeouts = _session.timeouts(settings)
            await _session.answer(conn, settings, doing, _sql.SET_TIMEOUTS, timeouts)
            rows = await (await _session.answer(conn, settings, doing, _sql.LOCKS)).fetchall()
        except psycopg.Error as exc:
            raise driver_error(settings.url, exc, "listing locks") from None
        finally:
            await conn.close()
        mine = dict(self._held)
        own_pid = self._pid
        infos = []
        for classid, objid, pid, app, addr, backend_start, query_start in rows:
            key = _signed64((classid << 32) | objid)
            lease = mine.get(key) if pid == own_pid else None
            infos.append(
                LockInfo(
                    key=key,
                    name=lease.name if lease else self._keys.name(key),
                    holder=_holder(pid, app, addr),
                    since=lease.acquired_at if lease else backend_start,
                    details={
                        "pid": pid,
                        "application_name": app,
                        "client_addr": addr,
                        "backend_start": backend_start,
                        "query_start": query_start,
                        "since_is": "acquired" if lease else "backend_start",
                        "fencing_token": lease.fencing_token if lease else None,
                    },
                )
            )
        return infos


class _Holding:
    """``async with locker._holding:`` holds the session: one round trip at a time (the
    mutex), the socket watch off meanwhile (an answer is no news), and the session
    idle again afterwards, to be watched while leases are held. With a ``deadline``,
    all of it, the wait for the mutex included, runs under it. A class, not a
    generator: this is on every call's path, and costs a fifth as much."""

    __slots__ = ("_deadline", "_locker", "_taken")

    def __init__(
        self,
        locker: AsyncPostgresLocker,
        deadline: AsyncDeadline | None = None,
        *,
        taken: bool = False,
    ) -> None:
        self._locker = locker
        self._deadline = deadline
        self._taken = taken  # held already, by the started path that hands over to us

    async def __aenter__(self) -> None:
        if self._taken:
            return
        if self._deadline is not None:
            self._deadline.__enter__()
        try:
            await self._locker._mutex.acquire()
        except BaseException:
            self._leave_deadline()
            raise
        self._locker._watch.busy()

    async def __aexit__(self, *exc: object) -> None:
        try:
            self._locker._let_go()
        finally:
            self._leave_deadline()

    def _leave_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.__exit__(None, None, None)


def _ended(conn: psycopg.AsyncConnection[Any]) -> str | None:
    """Read what waits on an idle session's socket; why the session ended, or ``None``
    if it lives (a notice, say)."""
    pgconn = conn.pgconn
    try:
        # The server's last message and the end of the stream may come apart: read on
        # while more is there (a few times at most: a live session sends little).
        for _ in range(3):
            pgconn.consume_input()
            if pgconn.status == pq.ConnStatus.BAD or not readable(pgconn.socket):
                break
    except psycopg.Error as exc:
        return f"the PostgreSQL session ended: {_reason(exc)}"
    if pgconn.status == pq.ConnStatus.BAD:
        return "the PostgreSQL session ended"
    return None


def _reason(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _signed64(value: int) -> int:
    return value - (1 << 64) if value >= (1 << 63) else value


def _holder(pid: int, app: str | None, addr: str | None) -> str:
    where = f" from {addr}" if addr else ""
    return f"pid {pid} {app!r}{where}" if app else f"pid {pid}{where}"


def _keys_shown(held: list[AsyncPostgresLease]) -> str:
    """The keys of ``held`` for a log line (made only when one is written)."""
    if len(held) == 1:
        return f"key {held[0].key} of {held[0].name!r}"
    return f"{len(held)} keys"


def _fire(lost: _Lost) -> None:
    """Fire ``lost`` outside the mutex: a callback may call back into the locker.
    A lease whose release was under way when its session died is not reported."""
    for lease, reason in lost:
        if not lease._released:
            lease.lost.set(reason)
