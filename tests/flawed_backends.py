"""Deliberately broken backends, built on the kit, to prove the conformance suite bites.

Each URL scheme is one in-process backend with one flaw (``sound`` has none:
it is the control, a TTL backend that must pass the whole suite):

* ``reentrant``: a locker is granted a name it already holds (PostgreSQL's
  advisory locks are re-entrant per session: a backend must track its holds).
* ``blocking``: ``try_acquire`` waits for the holder instead of returning None.
* ``uncancellable``: the async release is not shielded, so a cancellation that
  lands while it is in flight leaves the lock held.
* ``blinddelete``: release deletes the key whoever holds it (no compare-and-delete).
* ``leaky``: an async acquire cancelled after the server granted it, while the
  reply is still on its way, drops the lease on the floor: the lock stays held.
* ``nohooks``: declares LOST_SIGNAL but ships no ConformanceHooks to prove it.
* ``impatient``: ``acquire`` tries once and gives up, whatever its timeout.
* ``queueing``: a waiting ``acquire`` that times out leaves its claim queued: the name
  goes to that locker when its holder releases it (an abandoned blocking ``flock``).

:func:`register` registers them all with :func:`multilock.register_backend`;
the plugin tests copy this module into their pytester directory.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import math
import sqlite3
import threading
import time
import unicodedata
import zlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import multilock
from multilock.backend import (
    AsyncLeaseBase,
    AsyncLockerBase,
    Capability,
    Duration,
    LeaseBase,
    LockerBase,
    LockInfo,
    LockURL,
    OptionParser,
    as_duration,
    new_token,
)
from multilock.errors import BackendUnavailable, InvalidLockName, LockTimeout, NotOwner

__all__ = ["DEFECTS", "FLAWS", "FlawedBackend", "FlawedDbBackend", "db_backend", "register"]

FLAWS = (
    "sound",
    "reentrant",
    "blocking",
    "uncancellable",
    "blinddelete",
    "leaky",
    "nohooks",
    "impatient",
    "queueing",
)
_OPTIONS = OptionParser({"ttl": as_duration}, {"ttl": 30.0})
_BLOCK_AT_MOST = 3.5  # a blocking try_acquire gives up eventually, so broken runs end


class _Table:
    """The lock table of one namespace: name -> (token, monotonic expiry, owning locker)."""

    def __init__(self) -> None:
        self.guard = threading.Lock()
        self.holders: dict[str, tuple[str, float, object]] = {}
        self.fences: dict[str, int] = {}
        self.queued: dict[str, object] = {}  # name -> the locker its release goes to

    def queue(self, name: str, owner: object) -> None:
        with self.guard:
            self.queued[name] = owner

    def take(self, name: str, ttl: float, owner: object, flaw: str) -> tuple[str, int] | None:
        with self.guard:
            now = time.monotonic()
            held = self.holders.get(name)
            if held is not None and held[1] > now:
                if flaw == "reentrant" and held[2] is owner:
                    return held[0], self.fences[name]
                return None
            token = new_token()
            self.fences[name] = fence = self.fences.get(name, 0) + 1
            self.holders[name] = (token, now + ttl, owner)
            return token, fence

    def drop(self, name: str, token: str, blind: bool) -> bool:
        with self.guard:
            held = self.holders.get(name)
            if held is None or (not blind and held[0] != token):
                return False
            del self.holders[name]
            claimant = self.queued.pop(name, None)
            if claimant is not None:  # handed over to a claim nobody will release
                self.fences[name] += 1
                self.holders[name] = (new_token(), float("inf"), claimant)
            return held[1] > time.monotonic()

    def extend(self, name: str, token: str, ttl: float) -> None:
        with self.guard:
            held = self.holders.get(name)
            if held is None or held[0] != token or held[1] <= time.monotonic():
                raise NotOwner(f"lease on {name!r} expired or is held by another owner")
            self.holders[name] = (token, time.monotonic() + ttl, held[2])


_tables: dict[str, _Table] = {}
_tables_guard = threading.Lock()


class _Common:
    flaw = "sound"

    def _setup(self, url: LockURL) -> float:
        values, _ = _OPTIONS.parse(url)
        self._declare()
        with _tables_guard:
            self.table = _tables.setdefault(f"{url.scheme}/{url.host}{url.path}", _Table())
        self.mine: set[Any] = set()
        return float(values["ttl"])

    def _grant(self, name: str, ttl: float, cls: type[Any]) -> Any:
        got = self.table.take(name, ttl, self, self.flaw)
        if got is None:
            return None
        lease = cls(
            name, name, got[0], got[1], ttl if Capability.TTL in self.capabilities else None
        )
        lease.ttl, lease.table, lease.flaw, lease.mine = ttl, self.table, self.flaw, self.mine
        self.mine.add(lease)
        return lease

    def _drop_all(self) -> None:
        for lease in list(self.mine):
            lease._released = True
            self.table.drop(lease.name, lease.token, blind=False)
        self.mine.clear()

    capabilities: frozenset[Capability]

    def _declare(self) -> None:
        """TTL for the flaws that need expiry; LOST_SIGNAL for the one without hooks."""
        caps = {Capability.FENCING, Capability.BATCH}
        if self.flaw in ("sound", "blinddelete"):
            caps.add(Capability.TTL)
        if self.flaw == "nohooks":
            caps.add(Capability.LOST_SIGNAL)
        self.capabilities = frozenset(caps)


def _drop(lease: Any) -> bool:
    lease.mine.discard(lease)
    return bool(lease.table.drop(lease.name, lease.token, blind=lease.flaw == "blinddelete"))


class _Lease(LeaseBase):
    __slots__ = ("flaw", "mine", "table", "ttl")
    flaw: str
    mine: set[Any]
    table: _Table
    ttl: float

    def _release(self) -> bool:
        return _drop(self)

    def _extend(self, ttl: float | None) -> float | None:
        self.table.extend(self.name, self.token, ttl or self.ttl)
        return ttl or self.ttl


class _AsyncLease(AsyncLeaseBase):
    __slots__ = ("flaw", "mine", "table", "ttl")
    flaw: str
    mine: set[Any]
    table: _Table
    ttl: float

    async def release(self) -> bool:
        if self.flaw != "uncancellable":
            return await super().release()
        if self._released:
            return False
        self._released = True
        await asyncio.sleep(0.005)  # the round trip, left exposed to cancellation
        return _drop(self)

    async def _release(self) -> bool:
        return _drop(self)

    async def _extend(self, ttl: float | None) -> float | None:
        self.table.extend(self.name, self.token, ttl or self.ttl)
        return ttl or self.ttl


class _Locker(_Common, LockerBase):
    def __init__(self, url: LockURL, flaw: str) -> None:
        self.flaw = flaw
        super().__init__(url, default_ttl=self._setup(url))

    def _try_acquire(self, name: str, ttl: float) -> LeaseBase | None:
        deadline = time.monotonic() + _BLOCK_AT_MOST
        while True:
            lease: LeaseBase | None = self._grant(name, ttl, _Lease)
            if lease is not None or self.flaw != "blocking" or time.monotonic() > deadline:
                return lease
            time.sleep(0.01)

    def acquire(
        self, name: str, *, timeout: Duration | None = None, ttl: Duration | None = None
    ) -> LeaseBase:
        """The kit's waiting acquire -- but ``impatient`` never waits, and ``queueing``
        leaves a claim behind when it times out."""
        if self.flaw == "impatient":
            lease = self.try_acquire(name, ttl=ttl)
            if lease is None:
                raise LockTimeout(f"{name!r} is held")
            return lease
        try:
            return super().acquire(name, timeout=timeout, ttl=ttl)
        except LockTimeout:
            if self.flaw == "queueing":
                self.table.queue(name, self)
            raise

    def _close(self) -> None:
        self._drop_all()


class _AsyncLocker(_Common, AsyncLockerBase):
    def __init__(self, url: LockURL, flaw: str) -> None:
        self.flaw = flaw
        super().__init__(url, default_ttl=self._setup(url))

    async def try_acquire(self, name: str, *, ttl: Duration | None = None) -> AsyncLeaseBase | None:
        """The kit's acquire -- except that ``leaky`` skips its undo-on-cancel."""
        if self.flaw != "leaky":
            return await super().try_acquire(name, ttl=ttl)
        return await self._try_acquire(self._check(name), self._ttl(ttl))

    async def _try_acquire(self, name: str, ttl: float) -> AsyncLeaseBase | None:
        deadline = time.monotonic() + _BLOCK_AT_MOST
        while True:
            lease: AsyncLeaseBase | None = self._grant(name, ttl, _AsyncLease)
            if self.flaw == "leaky":
                await asyncio.sleep(0.002)  # granted; the reply is still on the wire
            if lease is not None or self.flaw != "blocking" or time.monotonic() > deadline:
                return lease
            await asyncio.sleep(0.01)

    async def acquire(
        self, name: str, *, timeout: Duration | None = None, ttl: Duration | None = None
    ) -> AsyncLeaseBase:
        """As the sync locker's."""
        if self.flaw == "impatient":
            lease = await self.try_acquire(name, ttl=ttl)
            if lease is None:
                raise LockTimeout(f"{name!r} is held")
            return lease
        try:
            return await super().acquire(name, timeout=timeout, ttl=ttl)
        except LockTimeout:
            if self.flaw == "queueing":
                self.table.queue(name, self)
            raise

    async def _close(self) -> None:
        self._drop_all()


class _Hooks:
    def crash_release_bound(self, url: LockURL, ttl: float) -> float:
        return ttl

    def break_lease(self, url: LockURL, locker: object, lease: object) -> None:
        raise NotImplementedError("these backends cannot drop a lease")

    def unreachable_url(self, url: LockURL) -> str | None:
        return None


class FlawedBackend:
    """One backend per flaw (see the module docstring)."""

    def __init__(self, flaw: str) -> None:
        self.flaw = flaw
        self.conformance = None if flaw == "nohooks" else _Hooks()

    def connect(self, url: LockURL) -> _Locker:
        """A sync locker with this backend's flaw."""
        return _Locker(url, self.flaw)

    def connect_async(self, url: LockURL) -> _AsyncLocker:
        """An async locker with this backend's flaw."""
        return _AsyncLocker(url, self.flaw)


def register() -> None:
    """Register every flaw as a URL scheme of its own name, and ``flawdb``."""
    for flaw in FLAWS:
        multilock.register_backend(flaw, FlawedBackend(flaw))
    multilock.register_backend("flawdb", db_backend)


# --- The cross-process catalogue -------------------------------------------------------
#
# ``flawdb:///path/locks.db?flaw=NAME``: leases in a SQLite file, so several processes
# share them (the suite's child processes find the scheme through an entry point that
# tests/test_plugin_flaws.py writes beside this module). With ``flaw=none`` it is a
# correct backend with TTL, FENCING, CROSS_PROCESS, INTROSPECTION, LOST_SIGNAL and
# BATCH; every other value of DEFECTS gives it exactly one defect.

DEFECTS = {
    "none": "the correct original",
    "stale_extend": "extend() checks that the name is held, not by whom: a stale holder's"
    " extend succeeds after another locker took the name",
    "process_tokens": "owner tokens from a per-process counter: unique only within a process",
    "locker_tokens": "owner tokens from a per-locker counter: unique only within a locker",
    "extend_ignores_ttl": "extend(ttl) pushes the expiry by the acquire's ttl, whatever ttl says",
    "extend_default": "extend() with no ttl uses the URL's default ttl, not the acquire's",
    "casefold_names": "names are case-folded into keys",
    "nfkc_names": "names are NFKC-normalized into keys",
    "truncated_names": "keys are the first 64 bytes of the name",
    "crc32_names": "keys are the CRC-32 of the name",
    "hash16_names": "keys are the first 16 bits of the name's SHA-256",
    "expires_at_off": "expires_at says one second more than the lease really has",
    "ttl_floor": "the ttl is rounded down to whole seconds on the server",
    "early_expiry": "a lease within half a second of its expiry counts as free",
    "ttl_never": "expired leases are never taken over: only a release frees a name",
    "lost_on_release": "lost fires after a clean release (the watcher forgets released leases)",
    "lost_never": "lost never fires: a lease dropped on the server goes unnoticed",
    "close_keeps": "close() forgets its leases without releasing them on the server",
    "fence_memory": "fencing tokens from a per-process counter, not the database",
    "fence_reset": "the fencing counter lives in the holder's row, so it restarts after a release",
    "release_true": "release() returns True whether or not it deleted anything",
    "many_leak_on_dup": "try_acquire_many grants names as it goes and leaks them on a duplicate",
    "many_all_or_nothing": "try_acquire_many refuses every name when one is held",
    "many_ignores_ttl": "try_acquire_many uses the default ttl, whatever ttl says",
    "locks_own": "locks() lists this locker's leases only",
    "none_when_down": "an unreachable database gives None, not BackendUnavailable",
    "naive_expires_at": "expires_at is a naive datetime",
    "claim_racy": "a tick claim reads the mark and writes it in two transactions:"
    " concurrent claimers of one tick both win",
    "claim_any_change": "a tick claim wins whenever the fire time differs from the mark:"
    " an older tick wins after a newer one",
}
"""The defects of ``flawdb://``, each with what it does wrong."""

_DB_OPTIONS = OptionParser({"ttl": as_duration, "flaw": str}, {"ttl": 30.0, "flaw": "none"})
_WATCH_EVERY = 0.1
_process_tokens = itertools.count()
_process_fences: dict[str, int] = {}

_DB_SCHEMA = """
CREATE TABLE IF NOT EXISTS holders (
    key TEXT PRIMARY KEY, name TEXT NOT NULL, token TEXT NOT NULL,
    expires REAL NOT NULL, fence INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS fences (key TEXT PRIMARY KEY, fence INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS marks (name TEXT PRIMARY KEY, fire INTEGER NOT NULL);
"""


def _key(name: str, flaw: str) -> str:
    if flaw == "casefold_names":
        return name.casefold()
    if flaw == "nfkc_names":
        return unicodedata.normalize("NFKC", name)
    if flaw == "truncated_names":
        return name.encode()[:64].decode(errors="ignore")
    if flaw == "crc32_names":
        return f"{zlib.crc32(name.encode()):08x}"
    if flaw == "hash16_names":
        return hashlib.sha256(name.encode()).hexdigest()[:4]
    return name


class _Db:
    """One SQLite connection, shared by a locker's threads; every decision in one
    ``BEGIN IMMEDIATE`` transaction."""

    def __init__(self, url: LockURL) -> None:
        values, _ = _DB_OPTIONS.parse(url)
        self.flaw, self.default_ttl = str(values["flaw"]), float(values["ttl"])
        if self.flaw not in DEFECTS:
            raise ValueError(f"unknown flaw {self.flaw!r}")
        self.path = url.path
        self.guard = threading.Lock()
        self.conn: sqlite3.Connection | None = None
        try:
            self._open()
        except BackendUnavailable:
            if self.flaw != "none_when_down":
                raise

    def _open(self) -> sqlite3.Connection:
        if self.conn is None:
            try:
                conn = sqlite3.connect(
                    self.path, timeout=5.0, isolation_level=None, check_same_thread=False
                )
                conn.executescript("PRAGMA journal_mode=WAL; PRAGMA synchronous=OFF;" + _DB_SCHEMA)
            except sqlite3.Error as exc:
                raise BackendUnavailable(f"cannot open {self.path!r}: {exc}") from None
            self.conn = conn
        return self.conn

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self.guard:
            try:
                db = self._open()
                db.execute("BEGIN IMMEDIATE")
                try:
                    yield db
                except BaseException:
                    db.execute("ROLLBACK")
                    raise
                db.execute("COMMIT")
            except sqlite3.Error as exc:
                raise BackendUnavailable(f"SQLite {self.path!r}: {exc}") from None

    def acquire(self, grants: list[tuple[str, str]], ttl: float) -> list[int | None]:
        """Take each (name, token) for ``ttl`` s in one transaction: a fence or None each."""
        try:
            return self._acquire(grants, ttl)
        except BackendUnavailable:
            if self.flaw != "none_when_down":
                raise
            return [None] * len(grants)

    def _acquire(self, grants: list[tuple[str, str]], ttl: float) -> list[int | None]:
        now = time.time()
        stored = math.floor(ttl) if self.flaw == "ttl_floor" else ttl
        free_before = now + (0.5 if self.flaw == "early_expiry" else 0.0)
        fences: list[int | None] = []
        with self._tx() as db:
            for name, token in grants:
                key = _key(name, self.flaw)
                if self.flaw != "ttl_never":
                    db.execute(
                        "DELETE FROM holders WHERE key = ? AND expires <= ?", (key, free_before)
                    )
                if db.execute("SELECT 1 FROM holders WHERE key = ?", (key,)).fetchone():
                    fences.append(None)
                    continue
                fences.append(fence := self._next_fence(db, key))
                db.execute(
                    "INSERT INTO holders VALUES (?, ?, ?, ?, ?)",
                    (key, name, token, now + stored, fence),
                )
        return fences

    def _next_fence(self, db: sqlite3.Connection, key: str) -> int:
        if self.flaw == "fence_memory":
            _process_fences[key] = _process_fences.get(key, 0) + 1
            return _process_fences[key]
        if self.flaw == "fence_reset":
            row = db.execute("SELECT fence FROM holders WHERE key = ?", (key,)).fetchone()
            return 1 if row is None else int(row[0]) + 1
        (fence,) = db.execute(
            "INSERT INTO fences VALUES (?, 1) ON CONFLICT (key) DO UPDATE SET fence = fence + 1"
            " RETURNING fence",
            (key,),
        ).fetchone()
        return int(fence)

    def release(self, names_tokens: list[tuple[str, str]]) -> list[bool]:
        """Compare-and-delete each (name, token)."""
        with self._tx() as db:
            done = [
                db.execute(
                    "DELETE FROM holders WHERE key = ? AND token = ?",
                    (_key(name, self.flaw), token),
                ).rowcount
                == 1
                for name, token in names_tokens
            ]
        return [True] * len(done) if self.flaw == "release_true" else done

    def extend(self, name: str, token: str, ttl: float) -> bool:
        """Compare-and-extend."""
        now = time.time()
        owner = "" if self.flaw == "stale_extend" else " AND token = ?"
        args = (now + ttl, _key(name, self.flaw), now) + (() if owner == "" else (token,))
        with self._tx() as db:
            sql = f"UPDATE holders SET expires = ? WHERE key = ? AND expires > ?{owner}"
            return db.execute(sql, args).rowcount == 1

    def present(self, name: str, token: str) -> bool:
        """Whether the row of (name, token) is still there (expired or not)."""
        with self._tx() as db:
            sql = "SELECT 1 FROM holders WHERE key = ? AND token = ?"
            return db.execute(sql, (_key(name, self.flaw), token)).fetchone() is not None

    def claim(self, names: list[str], fires: list[int]) -> list[bool]:
        """Raise each name's mark to its fire time where it is below: one transaction."""
        if self.flaw == "claim_racy":
            return [self._claim_racy(name, fire) for name, fire in zip(names, fires, strict=True)]
        won = []
        newer = "fire < excluded.fire"
        if self.flaw == "claim_any_change":
            newer = "fire <> excluded.fire"
        with self._tx() as db:
            for name, fire in zip(names, fires, strict=True):
                row = db.execute(
                    "INSERT INTO marks VALUES (?, ?) ON CONFLICT (name) DO UPDATE"
                    f" SET fire = excluded.fire WHERE {newer} RETURNING fire",
                    (name, fire),
                ).fetchone()
                won.append(row is not None)
        return won

    def _claim_racy(self, name: str, fire: int) -> bool:
        with self._tx() as db:
            row = db.execute("SELECT fire FROM marks WHERE name = ?", (name,)).fetchone()
        if row is not None and row[0] >= fire:
            return False
        time.sleep(0.002)  # the window another claimer falls into
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO marks VALUES (?, ?)", (name, fire))
        return True

    def holders(self, tokens: set[str] | None) -> list[LockInfo]:
        """Unexpired holders (of ``tokens`` only, when given)."""
        with self._tx() as db:
            rows = db.execute(
                "SELECT key, name, token, expires FROM holders WHERE expires > ?", (time.time(),)
            ).fetchall()
        return [
            LockInfo(key=k, name=n, holder=t, expires_at=datetime.fromtimestamp(e, UTC))
            for k, n, t, e in rows
            if tokens is None or t in tokens
        ]

    def close(self) -> None:
        with self.guard:
            if self.conn is not None:
                self.conn.close()


class _DbCore:
    """What a sync and an async locker of ``flawdb://`` share: the database, the live
    leases, the lost watcher, the grants."""

    capabilities = frozenset(
        {
            Capability.TTL,
            Capability.FENCING,
            Capability.CROSS_PROCESS,
            Capability.INTROSPECTION,
            Capability.LOST_SIGNAL,
            Capability.BATCH,
            Capability.TICK_CLAIM,
        }
    )

    def __init__(self, url: LockURL) -> None:
        self.db = _Db(url)
        self.flaw = self.db.flaw
        self.live: set[Any] = set()
        self.live_guard = threading.Lock()
        self.tokens = itertools.count()
        self.stop = threading.Event()
        if self.flaw != "lost_never":
            threading.Thread(target=self._watch, daemon=True, name="flawdb-watch").start()

    def token(self) -> str:
        if self.flaw == "process_tokens":
            return f"t{next(_process_tokens)}"
        if self.flaw == "locker_tokens":
            return f"t{next(self.tokens)}"
        return new_token()

    def grant(self, cls: type[Any], names: list[str], ttl: float) -> dict[str, Any]:
        """Leases of ``cls`` for ``names`` (None where held), in one transaction."""
        tokens = [self.token() for _ in names]
        fences = self.db.acquire(list(zip(names, tokens, strict=True)), ttl)
        result: dict[str, Any] = {}
        shown_ttl = ttl + 1.0 if self.flaw == "expires_at_off" else ttl
        for name, token, fence in zip(names, tokens, fences, strict=True):
            if fence is None:
                result[name] = None
                continue
            lease = cls(name, _key(name, self.flaw), token, fence, shown_ttl)
            lease.core, lease.ttl = self, ttl
            if self.flaw == "naive_expires_at":
                lease.expires_at = lease.expires_at.replace(tzinfo=None)
            with self.live_guard:
                self.live.add(lease)
            result[name] = lease
        return result

    def release(self, leases: list[Any]) -> list[bool]:
        with self.live_guard:
            if self.flaw != "lost_on_release":
                self.live.difference_update(leases)
        return self.db.release([(lease.name, lease.token) for lease in leases])

    def extend(self, lease: Any, ttl: float | None) -> float:
        seconds = lease.ttl if ttl is None else ttl
        if self.flaw == "extend_ignores_ttl":
            seconds = lease.ttl
        elif self.flaw == "extend_default" and ttl is None:
            seconds = self.db.default_ttl
        if not self.db.extend(lease.name, lease.token, seconds):
            raise NotOwner(f"lease on {lease.name!r} expired or has another holder")
        return seconds

    def locks(self, locker: Any) -> list[LockInfo]:
        if self.flaw == "locks_own":
            with self.live_guard:
                return self.db.holders({lease.token for lease in self.live})
        return self.db.holders(None)

    def close(self) -> None:
        self.stop.set()
        with self.live_guard:
            leases, self.live = list(self.live), set()
        for lease in leases:
            lease._released = True
        if self.flaw != "close_keeps":
            self.db.release([(lease.name, lease.token) for lease in leases])
        self.db.close()

    def _watch(self) -> None:
        """Fire ``lost`` on a live, unexpired lease whose row is gone (break_lease)."""
        while not self.stop.wait(_WATCH_EVERY):
            with self.live_guard:
                leases = list(self.live)
            for lease in leases:
                expires = lease.expires_at
                if expires.tzinfo is None:
                    expires = expires.replace(tzinfo=UTC)
                if expires <= datetime.now(UTC) + timedelta(seconds=_WATCH_EVERY):
                    continue  # expired (or about to): stale, not lost
                try:
                    gone = not self.db.present(lease.name, lease.token)
                except Exception:
                    continue  # closing
                if gone and (self.flaw == "lost_on_release" or not lease._released):
                    lease.lost.set("the lease's row was deleted")


class _DbLease(LeaseBase):
    __slots__ = ("core", "ttl")
    core: _DbCore
    ttl: float

    def _release(self) -> bool:
        return self.core.release([self])[0]

    def _extend(self, ttl: float | None) -> float | None:
        return self.core.extend(self, ttl)


class _AsyncDbLease(AsyncLeaseBase):
    __slots__ = ("core", "ttl")
    core: _DbCore
    ttl: float

    async def _release(self) -> bool:
        return (await asyncio.to_thread(self.core.release, [self]))[0]

    async def _extend(self, ttl: float | None) -> float | None:
        return await asyncio.to_thread(self.core.extend, self, ttl)


class _DbLocker(LockerBase):
    capabilities = _DbCore.capabilities

    def __init__(self, url: LockURL) -> None:
        self.core = _DbCore(url)
        super().__init__(url, default_ttl=self.core.db.default_ttl)

    def try_acquire_many(
        self, names: Iterable[str], *, ttl: Duration | None = None
    ) -> dict[str, LeaseBase | None]:
        """The kit's, but for the flaws that skip its checks."""
        if self.core.flaw == "many_leak_on_dup":
            return _grant_as_you_go(self, list(names), self._ttl(ttl))
        return super().try_acquire_many(names, ttl=ttl)

    def _try_acquire(self, name: str, ttl: float) -> LeaseBase | None:
        lease: LeaseBase | None = self.core.grant(_DbLease, [name], ttl)[name]
        return lease

    def _try_acquire_many(self, names: list[str], ttl: float) -> dict[str, LeaseBase | None]:
        got: dict[str, LeaseBase | None] = _batch(self.core, _DbLease, names, ttl, self.default_ttl)
        return got

    def locks(self) -> list[LockInfo]:
        """Unexpired holders."""
        return self.core.locks(self)

    def _claim_ticks(self, names: list[str], fires: list[int]) -> list[bool]:
        return self.core.db.claim(names, fires)

    def _close(self) -> None:
        self.core.close()


class _AsyncDbLocker(AsyncLockerBase):
    capabilities = _DbCore.capabilities

    def __init__(self, url: LockURL) -> None:
        self.core = _DbCore(url)
        super().__init__(url, default_ttl=self.core.db.default_ttl)

    async def try_acquire_many(
        self, names: Iterable[str], *, ttl: Duration | None = None
    ) -> dict[str, AsyncLeaseBase | None]:
        """The kit's, but for the flaws that skip its checks."""
        if self.core.flaw == "many_leak_on_dup":
            names, seconds = list(names), self._ttl(ttl)
            return await asyncio.to_thread(_grant_as_you_go, self, names, seconds)
        return await super().try_acquire_many(names, ttl=ttl)

    async def _try_acquire(self, name: str, ttl: float) -> AsyncLeaseBase | None:
        got = await asyncio.to_thread(self.core.grant, _AsyncDbLease, [name], ttl)
        lease: AsyncLeaseBase | None = got[name]
        return lease

    async def _try_acquire_many(
        self, names: list[str], ttl: float
    ) -> dict[str, AsyncLeaseBase | None]:
        return await asyncio.to_thread(
            _batch, self.core, _AsyncDbLease, names, ttl, self.default_ttl
        )

    async def locks(self) -> list[LockInfo]:
        """Unexpired holders."""
        return await asyncio.to_thread(self.core.locks, self)

    async def _claim_ticks(self, names: list[str], fires: list[int]) -> list[bool]:
        return await asyncio.to_thread(self.core.db.claim, names, fires)

    async def _close(self) -> None:
        await asyncio.to_thread(self.core.close)


def _batch(core: _DbCore, cls: type[Any], names: list[str], ttl: float, default: float) -> Any:
    """try_acquire_many in one transaction (BATCH), with the batch flaws."""
    got = core.grant(cls, names, default if core.flaw == "many_ignores_ttl" else ttl)
    if core.flaw == "many_all_or_nothing" and None in got.values():
        core.release([lease for lease in got.values() if lease is not None])
        for lease in got.values():
            if lease is not None:
                lease._released = True
        return dict.fromkeys(names)
    return got


def _grant_as_you_go(locker: Any, names: list[str], ttl: float) -> dict[str, Any]:
    """``many_leak_on_dup``: one name at a time, a duplicate found when reached."""
    result: dict[str, Any] = {}
    cls = _AsyncDbLease if isinstance(locker, _AsyncDbLocker) else _DbLease
    for name in names:
        if name in result:
            raise InvalidLockName(f"duplicate lock name {name!r}")
        result[name] = locker.core.grant(cls, [locker._check(name)], ttl)[name]
    return result


class _DbHooks:
    def crash_release_bound(self, url: LockURL, ttl: float) -> float:
        return ttl

    def break_lease(self, url: LockURL, locker: object, lease: object) -> None:
        conn = sqlite3.connect(url.path, timeout=5.0)
        try:
            with conn:
                conn.execute("DELETE FROM holders WHERE token = ?", (lease.token,))  # type: ignore[attr-defined]
        finally:
            conn.close()

    def unreachable_url(self, url: LockURL) -> str | None:
        return f"flawdb:///proc/multilock-unreachable/locks.db?flaw={_DB_OPTIONS.parse(url)[0]['flaw']}"


class FlawedDbBackend:
    """``flawdb://``: the cross-process catalogue (see DEFECTS)."""

    conformance = _DbHooks()

    def connect(self, url: LockURL) -> _DbLocker:
        """A sync locker."""
        return _DbLocker(url)

    def connect_async(self, url: LockURL) -> _AsyncDbLocker:
        """An async locker."""
        return _AsyncDbLocker(url)


db_backend = FlawedDbBackend()
"""What the ``flawdb`` entry point resolves to."""
