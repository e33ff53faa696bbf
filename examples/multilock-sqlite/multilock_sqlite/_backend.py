"""``sqlite:///path/to/locks.db``: leases in a SQLite table, for replicas on one host.

Built from the kit in :mod:`multilock.backend`: the bases validate names and
ttls, make ``release()`` idempotent, shield it from cancellation and undo an
acquire whose caller was cancelled. This module only says how to ask SQLite.
"""

from __future__ import annotations

import asyncio
from typing import Any, TypeVar

from multilock.backend import (
    AsyncLeaseBase,
    AsyncLockerBase,
    Capability,
    LeaseBase,
    LockerBase,
    LockInfo,
    LockURL,
    OptionParser,
    as_duration,
    new_token,
)
from multilock.errors import InvalidURL, NotOwner

from ._store import Store

__all__ = ["AsyncSQLiteLocker", "SQLiteBackend", "SQLiteLocker", "backend"]

# --8<-- [start:options]
_OPTIONS = OptionParser(
    {"ttl": as_duration, "busy_timeout": as_duration},
    {"ttl": 30.0, "busy_timeout": 5.0},
)
# --8<-- [end:options]


def _open(url: LockURL) -> tuple[Store, float]:
    """The store of ``url`` and its default ttl; bad URLs and options are refused."""
    if url.host not in (None, "", "localhost"):
        raise InvalidURL(f"sqlite:// names a local file, not host {url.host!r}: use sqlite:///path")
    if url.path in ("", "/"):
        raise InvalidURL("sqlite:// needs a database file: sqlite:///path/to/locks.db")
    values, _ = _OPTIONS.parse(url)  # unknown options raise InvalidOption
    return Store(url.path, float(values["busy_timeout"])), float(values["ttl"])


# --8<-- [start:leases]
class SQLiteLease(LeaseBase):
    """A lease of ``sqlite://`` (sync API)."""

    __slots__ = ("_locker", "_ttl")
    _locker: SQLiteLocker
    _ttl: float  # the acquire's ttl: what extend() pushes by when given none

    def _release(self) -> bool:
        self._locker._leases.discard(self)
        return self._locker._store.release(self.name, self.token)

    def _extend(self, ttl: float | None) -> float | None:
        seconds = self._ttl if ttl is None else ttl
        if not self._locker._store.extend(self.name, self.token, seconds):
            raise NotOwner(f"lease on {self.name!r} expired and may have a new holder")
        return seconds


class AsyncSQLiteLease(AsyncLeaseBase):
    """A lease of ``sqlite://`` (async API): the same SQL, run in a worker thread."""

    __slots__ = ("_locker", "_ttl")
    _locker: AsyncSQLiteLocker
    _ttl: float

    async def _release(self) -> bool:
        self._locker._leases.discard(self)
        return await asyncio.to_thread(self._locker._store.release, self.name, self.token)

    async def _extend(self, ttl: float | None) -> float | None:
        seconds = self._ttl if ttl is None else ttl
        store = self._locker._store
        if not await asyncio.to_thread(store.extend, self.name, self.token, seconds):
            raise NotOwner(f"lease on {self.name!r} expired and may have a new holder")
        return seconds


# --8<-- [end:leases]
# --8<-- [start:lockers]
L = TypeVar("L", SQLiteLease, AsyncSQLiteLease)


class _SQLiteCommon:
    """What the sync and the async locker share: the store, the promises, the leases."""

    capabilities = frozenset(
        {Capability.TTL, Capability.FENCING, Capability.CROSS_PROCESS, Capability.INTROSPECTION}
    )
    _store: Store
    _leases: set[Any]

    def _setup(self, url: LockURL) -> float:
        self._store, ttl = _open(url)
        self._leases = set()
        return ttl

    def _granted(
        self, cls: type[L], name: str, token: str, fence: int | None, ttl: float
    ) -> L | None:
        """The lease object for a granted acquire (``fence`` is ``None`` when refused)."""
        if fence is None:
            return None
        lease = cls(name, name, token, fence, ttl)
        lease._locker = self  # type: ignore[assignment]
        lease._ttl = ttl
        self._leases.add(lease)
        return lease

    def locks(self) -> list[LockInfo]:
        """Every unexpired lock in the database, whoever holds it."""
        return self._store.holders()


class SQLiteLocker(_SQLiteCommon, LockerBase):
    """Sync locker of ``sqlite://``."""

    def __init__(self, url: LockURL) -> None:
        super().__init__(url, default_ttl=self._setup(url))

    def _try_acquire(self, name: str, ttl: float) -> SQLiteLease | None:
        token = new_token()
        return self._granted(SQLiteLease, name, token, self._store.acquire(name, token, ttl), ttl)

    def _close(self) -> None:
        for lease in list(self._leases):
            lease.release()
        self._store.close()


class AsyncSQLiteLocker(_SQLiteCommon, AsyncLockerBase):
    """Async locker of ``sqlite://``: the same SQL, each call in a worker thread."""

    def __init__(self, url: LockURL) -> None:
        super().__init__(url, default_ttl=self._setup(url))

    async def _try_acquire(self, name: str, ttl: float) -> AsyncSQLiteLease | None:
        token = new_token()
        fence = await asyncio.to_thread(self._store.acquire, name, token, ttl)
        return self._granted(AsyncSQLiteLease, name, token, fence, ttl)

    async def _close(self) -> None:
        for lease in list(self._leases):
            await lease.release()
        await asyncio.to_thread(self._store.close)


# --8<-- [end:lockers]


# --8<-- [start:backend]
class _Hooks:
    """What the conformance suite needs beyond the contract."""

    def crash_release_bound(self, url: LockURL, ttl: float) -> float:
        return ttl  # a dead holder's row stays until it expires

    def break_lease(self, url: LockURL, locker: object, lease: object) -> None:
        raise NotImplementedError("no LOST_SIGNAL: nothing tells a holder its row was deleted")

    def unreachable_url(self, url: LockURL) -> str | None:
        return "sqlite:///proc/multilock-unreachable/locks.db"  # a file nobody can create


class SQLiteBackend:
    """The ``sqlite://`` backend: what the entry point resolves to."""

    conformance = _Hooks()

    def connect(self, url: LockURL) -> SQLiteLocker:
        """A sync locker."""
        return SQLiteLocker(url)

    def connect_async(self, url: LockURL) -> AsyncSQLiteLocker:
        """An async locker."""
        return AsyncSQLiteLocker(url)


backend = SQLiteBackend()
# --8<-- [end:backend]
