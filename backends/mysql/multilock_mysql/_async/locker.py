"""The MySQL/MariaDB locker: user-level locks (``GET_LOCK``) on one dedicated session.

One connection per locker holds every lease of that locker; it is never pooled and
runs in autocommit, so a lock lives exactly as long as the session. ``GET_LOCK`` is
re-entrant per session, so the locker tracks what it holds by key: a second
acquirer of a held key in this process gets ``None``, and each key is released
exactly once. Every use of the connection is serialized by one mutex, held only
across a single round trip (or a connect), and every round trip is bounded: by
``health_timeout`` for the health check, ``timeout`` for the others.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from pymysql.err import MySQLError

from multilock.backend import AsyncLeaseBase, AsyncLockerBase, Capability, LockInfo, LockURL
from multilock.backend import new_token as _new_token
from multilock.errors import BackendUnavailable, ConfigurationError, MultilockError

from .. import _introspect, _sql
from .._config import Settings, parse_settings
from .._errors import driver_error, fencing_error
from .._keys import KeyNames
from .._runtime import (
    AsyncBound,
    AsyncGuard,
    AsyncMutex,
    AsyncWatch,
    Row,
    async_ask,
    async_connect,
    async_hang_up,
    async_is_open,
)
from .._started import AsyncStartedLease, AsyncStartedLocker

__all__ = ["AsyncMySQLLease", "AsyncMySQLLocker"]

_log = logging.getLogger("multilock.mysql")

_Lost = list[tuple["AsyncMySQLLease", str]]
"""Leases whose session died, with the reason: fired once the mutex is released."""

_DRIVER_ERRORS = (MySQLError, OSError, TimeoutError)

_CAPABILITIES = frozenset(
    {
        Capability.SESSION,
        Capability.CROSS_PROCESS,
        Capability.CROSS_HOST,
        Capability.LOST_SIGNAL,
        Capability.INTROSPECTION,
        Capability.BATCH,
    }
)


class AsyncMySQLLease(AsyncStartedLease, AsyncLeaseBase):
    """A user-level lock. ``expires_at`` is ``None``: it lasts as long as the session,
    and ``extend()`` only checks that the session is alive."""

    __slots__ = ("_locker", "acquired_at")

    key: str
    _locker: AsyncMySQLLocker
    acquired_at: datetime
    """When the server granted the lock (local clock, UTC)."""

    async def _release(self) -> bool:
        return await self._locker._unlock([self]) == 1

    async def _extend(self, ttl: float | None) -> float | None:
        await self._locker._check_alive(self)
        return None


class AsyncMySQLLocker(AsyncStartedLocker, AsyncLockerBase):
    """Locks of a ``mysql://`` or ``mariadb://`` URL, taken with ``GET_LOCK(key, 0)``."""

    max_name_length = None  # any name: one too long for the server is hashed (_keys)

    def __init__(self, url: LockURL) -> None:
        settings = parse_settings(url)
        super().__init__(url, default_ttl=settings.ttl)
        self._settings: Settings = settings
        fencing = {Capability.FENCING} if settings.fence else set()
        self.capabilities = _CAPABILITIES | fencing
        self._mutex = AsyncMutex()
        self._conn: Any = None
        self._cursor: Any = None
        self._connection_id: int | None = None
        self._held: dict[str, AsyncMySQLLease] = {}
        self._suspects: set[str] = set()
        self._keys = KeyNames(settings.prefix)
        self._guard = AsyncGuard(self._cut)
        self._watch = AsyncWatch(
            self._session_ended,
            self._health_check,
            settings.health_interval,
            "multilock-mysql-watch",
        )

    @property
    def connection_id(self) -> int | None:
        """The server's id of the session holding the leases (``None`` when not
        connected): what ``KILL CONNECTION`` and the process list know it by."""
        return self._connection_id

    def key(self, name: str) -> str:
        """The user-level lock name of ``name`` on the server (see ``lock_key``)."""
        return self._keys.key(self._check(name))

    # -- acquiring ----------------------------------------------------------------------

    async def _try_acquire(
        self, name: str, ttl: float, failed: BaseException | None = None
    ) -> AsyncMySQLLease | None:
        """``failed``: the started path (``_started.py``) sent this acquire, holding the
        mutex, and met this error: handled as if this call's own round trip had."""
        key = self._keys.key(name)
        lost: _Lost = []
        try:
            async with self._mutex if failed is None else _Taken(self._mutex):
                if key in self._held:
                    return None  # this session holds it: re-entry would be a second owner
                if self._settings.fence is None:  # the hot path: one key, one answer
                    granted, fence = await self._lock_one(key, lost, failed) == b"1", None
                else:
                    grants, fences = await self._lock([key], lost, failed)
                    granted, fence = grants[0], fences[0]
                if not granted:
                    return None
                return self._grant(name, key, _new_token(), fence, datetime.now(UTC))
        finally:
            if lost:
                _fire(lost)

    async def _try_acquire_many(
        self, names: list[str], ttl: float, failed: BaseException | None = None
    ) -> dict[str, AsyncLeaseBase | None]:
        """``failed``: as for :meth:`_try_acquire`."""
        keys = [self._keys.key(name) for name in names]
        lost: _Lost = []
        try:
            async with self._mutex if failed is None else _Taken(self._mutex):
                wanted = [key for key in keys if key not in self._held]
                won: dict[str, int | None] = {}
                if wanted:
                    granted, fences = await self._lock(wanted, lost, failed)
                    won = {k: f for k, g, f in zip(wanted, granted, fences, strict=True) if g}
                return self._grant_many(names, keys, won)
        finally:
            if lost:
                _fire(lost)

    def _grant_many(
        self, names: list[str], keys: list[str], won: dict[str, int | None]
    ) -> dict[str, AsyncLeaseBase | None]:
        """A lease (with its fencing token) for each name whose key is in ``won``, else
        ``None``. Granted by one statement: one timestamp serves the whole batch, and
        one owner token, made unique per lease by its position."""
        now, batch = datetime.now(UTC), _new_token()
        result: dict[str, AsyncLeaseBase | None] = {}
        for i, (name, key) in enumerate(zip(names, keys, strict=True)):
            if key in won:
                result[name] = self._grant(name, key, f"{batch}.{i:x}", won[key], now)
            else:
                result[name] = None
        return result

    async def _lock_one(
        self, key: str, lost: _Lost, failed: BaseException | None = None
    ) -> bytes | None:
        """``GET_LOCK`` of one key without fencing: its answer (``b"1"``: granted). Should
        the answer be lost on a session that lives on, the key is suspect (see below)."""
        try:
            (answer,) = await self._ask(_sql.lock(key), lost, "try_acquire", failed=failed)
        except BaseException:
            if self._conn is not None:
                self._suspects.add(key)
            raise
        return answer

    async def _lock(
        self, keys: list[str], lost: _Lost, failed: BaseException | None = None
    ) -> tuple[list[bool], list[int | None]]:
        """Ask for ``keys`` in one round trip: whether each was granted, and its fencing
        token. Caller holds the mutex. Should the answer be lost on a session that
        lives on, the keys are suspect: released before the next statement."""
        fence = self._settings.fence
        try:
            if fence is not None:
                grants, last, changed = await self._ask(
                    _sql.fenced_lock(keys, fence), lost, "try_acquire", failed=failed
                )
                granted = _sql.answers(grants, len(keys))
                count = sum(granted)
                if count and changed != b"1":
                    taken = [key for key, g in zip(keys, granted, strict=True) if g]
                    await self._ask(_sql.unlock_many(taken), lost, "release", reconnect=False)
                    raise ConfigurationError(
                        f"MySQL at {self.url}: the fencing sequence table {fence} has lost its"
                        f" row id={_sql.FENCE_ROW}; tokens cannot be handed out"
                    )
                top = int(last or 0)
                tokens = iter(range(top - count + 1, top + 1))
                return granted, [next(tokens) if g else None for g in granted]
            (grants,) = await self._ask(_sql.lock_many(keys), lost, "try_acquire", failed=failed)
            return _sql.answers(grants, len(keys)), [None] * len(keys)
        except BaseException:
            if self._conn is not None:
                self._suspects.update(key for key in keys if key not in self._held)
            raise

    def _grant(
        self, name: str, key: str, token: str, fence: int | None, acquired_at: datetime
    ) -> AsyncMySQLLease:
        lease = AsyncMySQLLease(name, key, token, fence)
        lease._locker = self
        lease.acquired_at = acquired_at
        self._held[key] = lease
        return lease

    # -- releasing ----------------------------------------------------------------------

    async def _release_leases(self, leases: list[AsyncLeaseBase]) -> None:
        """Free ``leases`` in one round trip."""
        await self._unlock([lease for lease in leases if isinstance(lease, AsyncMySQLLease)])

    async def _unlock(
        self, leases: list[AsyncMySQLLease], failed: BaseException | None = None
    ) -> int:
        """Release, in one round trip, those of ``leases`` the session still holds (one
        lost with its session, or never ours, has nothing to free); how many were freed.
        ``failed``: as for :meth:`_try_acquire`."""
        lost: _Lost = []
        try:
            async with self._mutex if failed is None else _Taken(self._mutex):
                keys = [lease.key for lease in leases if self._held.get(lease.key) is lease]
                if not keys:
                    return 0
                one = len(keys) == 1
                query = _sql.unlock(keys[0]) if one else _sql.unlock_many(keys)
                try:
                    (answer,) = await self._ask(
                        query, lost, "release", reconnect=False, failed=failed
                    )
                except MultilockError as exc:
                    # A dead session took the locks with it. A live one that failed to
                    # answer keeps the keys tracked, to be released on close.
                    _log.warning("releasing user-level locks %s: %s", keys, exc)
                    return 0
                return self._unlocked(keys, answer)
        finally:
            if lost:
                _fire(lost)

    def _unlocked(self, keys: list[str], answer: bytes | None) -> int:
        """Forget ``keys``, released by one statement whose answer is ``answer``; how
        many the server freed."""
        for key in keys:
            del self._held[key]
        one = len(keys) == 1
        freed = int(answer == b"1") if one else sum(_sql.answers(answer, len(keys)))
        if freed != len(keys):
            _log.error("locks %s: %d not held by the session", keys, len(keys) - freed)
        return freed

    # -- health -------------------------------------------------------------------------

    async def _check_alive(self, lease: AsyncMySQLLease) -> None:
        """One round trip on the session: if it is dead, the lease is reported lost."""
        lost: _Lost = []
        try:
            async with self._mutex:
                if self._held.get(lease.key) is lease:
                    try:
                        await self._ask("SELECT 1", lost, "extend", reconnect=False)
                    except MultilockError:
                        if self._held.get(lease.key) is lease:
                            raise  # the session lives on but could not answer
        finally:
            _fire(lost)
        lease._check_extendable()

    async def _health_check(self) -> None:
        """Every ``health_interval``, with leases held: one round trip on the session,
        bounded by ``health_timeout``. A session that does not answer in
        time is cut off and its leases reported lost, even where TCP would not notice
        (a hung server or proxy, a cut network)."""
        lost: _Lost = []
        try:
            async with self._mutex:
                if self._held and self._cursor is not None:
                    await self._ask("SELECT 1", lost, "health check", reconnect=False, health=True)
        except MultilockError as exc:
            _log.debug("MySQL session health check: %s", exc)
        finally:
            _fire(lost)

    async def _session_ended(self, conn: Any) -> None:
        """The watch saw the server hang up ``conn``'s session: its leases are lost now,
        not at the next round trip."""
        lost: _Lost = []
        try:
            async with self._mutex:
                if self._conn is conn:
                    lost = self._drop_session("the MySQL session ended: the server closed it")
        finally:
            _fire(lost)

    # -- the session --------------------------------------------------------------------

    async def _ask(
        self,
        query: str,
        lost: _Lost,
        doing: str,
        *,
        reconnect: bool = True,
        health: bool = False,
        failed: BaseException | None = None,
    ) -> Row:
        """One round trip on the session, connecting first if needed: the first row of
        the last of the query's result sets, each column's text (``None``: ``NULL``).
        Caller holds the mutex. If an established
        session turns out dead, its leases go to ``lost`` and, when ``reconnect``, the
        query is asked once more on a new session: the old session's locks died with
        it, so nothing is granted twice. A session that did not answer in time (within
        ``timeout``, or ``health_timeout`` for the ``health`` check) is not asked again:
        a new one would most likely hang the same way. ``failed``: the error the started
        path met asking ``query`` on this session, raised here in its place."""
        settings = self._settings
        timeout = settings.health_timeout if health else settings.timeout
        retry = reconnect
        while True:
            cursor = self._cursor
            if cursor is None:
                if not reconnect:
                    raise BackendUnavailable(f"MySQL at {self.url}: not connected")
                cursor = await self._connect()
                retry = False
            try:
                if failed is not None:
                    error, failed = failed, None
                    raise error
                async with self._guard.until(timeout, self._conn):
                    if self._suspects:
                        await self._release_suspects(cursor)
                    return await async_ask(self._conn, query.encode())
            except _DRIVER_ERRORS as exc:
                hung = self._guard.expired or _timed_out(exc)
                if not hung and self._conn is not None and async_is_open(self._conn):
                    raise driver_error(self._settings.url, exc, doing) from None
                reason = (
                    f"the MySQL session did not answer within {timeout:g} s"
                    if hung
                    else f"the MySQL session ended: {_reason(exc)}"
                )
                lost += self._drop_session(reason)
                if hung:
                    raise BackendUnavailable(f"MySQL at {self.url}: {doing}: {reason}") from None
                if not retry:
                    raise driver_error(self._settings.url, exc, doing) from None
                retry = False

    def _cut(self) -> None:
        """A round trip outlived its bound: close the connection, which fails
        the read in flight (``_ask`` then drops the session and says why)."""
        if self._conn is not None:
            async_hang_up(self._conn)

    async def _release_suspects(self, cursor: Any) -> None:
        keys = [key for key in self._suspects if key not in self._held]
        self._suspects.clear()
        if keys:
            await cursor.execute(_sql.unlock_many(keys))
            await cursor.fetchone()

    async def _connect(self) -> Any:
        settings = self._settings
        if self._closed:
            raise MultilockError(f"{self!r} is closed")
        conn: Any = None
        try:
            async with AsyncBound(settings.connect_timeout + settings.timeout) as bound:
                conn = await async_connect(settings, bound)
                cursor = await conn.cursor()
                if settings.fence is not None:
                    await self._ensure_fence(cursor, settings.fence)
        except BaseException as exc:
            if conn is not None:
                async_hang_up(conn)
            if isinstance(exc, _DRIVER_ERRORS) and not isinstance(exc, MultilockError):
                if conn is not None and settings.fence is not None and not _timed_out(exc):
                    raise fencing_error(settings.url, settings.fence, exc) from None
                raise driver_error(settings.url, exc, "connecting") from None
            raise
        self._conn, self._cursor = conn, cursor
        self._connection_id = conn.thread_id()
        self._watch.watch(conn)
        return cursor

    async def _ensure_fence(self, cursor: Any, fence: _sql.FenceTable) -> None:
        """Make the sequence table if missing; refuse one that cannot keep the counter,
        has lost its row, or that this user may not update."""
        await cursor.execute(fence.engine())
        row = await cursor.fetchone()
        if row is None:
            await cursor.execute(fence.create())
            await cursor.execute(fence.seed())
        else:
            engine = str(row[0]).upper()
            if engine in _sql.VOLATILE_ENGINES:
                raise ConfigurationError(
                    f"MySQL at {self.url}: the fencing sequence table {fence} uses the"
                    f" {engine} engine, which does not keep its counter: tokens would start"
                    f" again from 1 (ALTER TABLE {fence.quoted} ENGINE=InnoDB)"
                )
            await cursor.execute(fence.row())
            if await cursor.fetchone() is None:
                raise ConfigurationError(
                    f"MySQL at {self.url}: the fencing sequence table {fence} has no row"
                    f" id={_sql.FENCE_ROW}; add it with a value above every token handed out"
                    f" (0 for a new table): INSERT INTO {fence.quoted} VALUES"
                    f" ({_sql.FENCE_ROW}, <value>)"
                )
        await cursor.execute(fence.may_update())

    def _drop_session(self, reason: str) -> _Lost:
        """Forget a dead session; return its leases, to be fired outside the mutex."""
        conn, self._conn, self._cursor, self._connection_id = self._conn, None, None, None
        leases = [(lease, reason) for lease in self._held.values()]
        self._held.clear()
        self._suspects.clear()
        self._watch.watch(None)
        if conn is not None:
            async_hang_up(conn)
        return leases

    async def _close(self) -> None:
        await self._watch.stop()
        async with self._mutex:
            conn, cursor = self._conn, self._cursor
            self._conn, self._cursor, self._connection_id = None, None, None
            leases = list(self._held.values())
            self._held.clear()
            for lease in leases:
                lease._released = True
            if conn is None:
                return
            try:
                if leases or self._suspects:
                    # Release before closing: the server ends a closed session a little
                    # later, and the next holder should not have to wait for that.
                    async with AsyncBound(self._settings.timeout) as bound:
                        bound.watch(conn)
                        await cursor.execute(_sql.UNLOCK_ALL)
                        await cursor.fetchone()
            except _DRIVER_ERRORS as exc:
                _log.debug("releasing on close: %s", exc)
            finally:
                self._suspects.clear()
                async_hang_up(conn)

    # -- introspection ------------------------------------------------------------------

    async def locks(self) -> list[LockInfo]:
        """The user-level locks held on the server, by any session, from
        ``performance_schema.metadata_locks`` or MariaDB's ``METADATA_LOCK_INFO``
        (a ``ConfigurationError`` says how to enable one when the server has neither).

        ``name`` is known for readable keys and for hashed keys this locker has seen;
        ``since`` only for this locker's own leases (the server does not record when
        a user-level lock was taken)."""
        # A connection of its own: a slow catalog query must not hold up the session.
        settings = self._settings
        conn: Any = None
        try:
            async with AsyncBound(settings.connect_timeout + 2 * settings.timeout) as bound:
                conn = await async_connect(settings, bound)
                cursor = await conn.cursor()
                await cursor.execute(_introspect.PROBE)
                source = _introspect.choose(settings.url, await cursor.fetchone())
                await cursor.execute(source.query)
                rows = list(await cursor.fetchall())
        except _DRIVER_ERRORS as exc:
            raise driver_error(settings.url, exc, "listing locks") from None
        finally:
            if conn is not None:
                async_hang_up(conn)
        return _introspect.infos(rows, source, self._keys, dict(self._held), self._connection_id)


def _timed_out(exc: BaseException) -> bool:
    """A round trip that got no answer in time: asyncio's deadline, or a socket timeout
    under the driver's error."""
    return isinstance(exc, TimeoutError) or isinstance(exc.__context__, TimeoutError)


def _reason(exc: BaseException) -> str:
    text = str(exc.args[-1] if exc.args else exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _fire(lost: _Lost) -> None:
    """Fire ``lost`` outside the mutex: a callback may call back into the locker.
    A lease whose release was under way when its session died is not reported."""
    for lease, reason in lost:
        if not lease._released:
            lease.lost.set(reason)


class _Taken:
    """The session's mutex, taken already by the started path that hands its call over
    (``failed=``): released at the end of the block, as ``async with mutex`` would."""

    __slots__ = ("_mutex",)

    def __init__(self, mutex: AsyncMutex) -> None:
        self._mutex = mutex

    async def __aenter__(self) -> None:
        pass

    async def __aexit__(self, *exc: object) -> None:
        self._mutex.release()
