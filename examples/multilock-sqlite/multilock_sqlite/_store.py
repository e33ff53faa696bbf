"""The SQL of the ``sqlite://`` backend: one table of holders, one of fencing counters.

Every statement that decides who holds a name runs inside ``BEGIN IMMEDIATE``,
which takes SQLite's write lock at once: two processes cannot both see a name
free and both insert it.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

from multilock.backend import LockInfo
from multilock.errors import BackendUnavailable

__all__ = ["Store"]

# --8<-- [start:schema]
_SCHEMA = """
CREATE TABLE IF NOT EXISTS multilock_holders (
    name    TEXT PRIMARY KEY,
    token   TEXT NOT NULL,
    expires REAL NOT NULL      -- Unix time; every process on the host shares the clock
);
CREATE TABLE IF NOT EXISTS multilock_fences (
    name  TEXT PRIMARY KEY,
    fence INTEGER NOT NULL     -- survives releases, so tokens only ever grow
);
"""
# --8<-- [end:schema]


class Store:
    """One SQLite connection, shared by a locker's threads under a mutex."""

    def __init__(self, path: str, busy_timeout: float) -> None:
        self._guard = threading.Lock()
        try:
            # isolation_level=None: we issue BEGIN IMMEDIATE ourselves.
            self._db = sqlite3.connect(
                path, timeout=busy_timeout, isolation_level=None, check_same_thread=False
            )
            self._db.executescript(_SCHEMA)
        except sqlite3.Error as exc:
            raise BackendUnavailable(f"cannot open SQLite database {path!r}: {exc}") from None
        self._path = path

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._guard:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    yield self._db
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                # "database is locked" past busy_timeout, disk errors...: not "held elsewhere".
                raise BackendUnavailable(f"SQLite database {self._path!r}: {exc}") from None

    # --8<-- [start:acquire]
    def acquire(self, name: str, token: str, ttl: float) -> int | None:
        """Take ``name`` for ``ttl`` seconds: its new fencing token, or ``None`` if held."""
        now = time.time()
        with self._transaction() as db:
            db.execute("DELETE FROM multilock_holders WHERE name = ? AND expires <= ?", (name, now))
            taken = db.execute(
                "INSERT INTO multilock_holders (name, token, expires) VALUES (?, ?, ?)"
                " ON CONFLICT (name) DO NOTHING",
                (name, token, now + ttl),
            ).rowcount
            if taken != 1:
                return None
            (fence,) = db.execute(
                "INSERT INTO multilock_fences (name, fence) VALUES (?, 1)"
                " ON CONFLICT (name) DO UPDATE SET fence = fence + 1 RETURNING fence",
                (name,),
            ).fetchone()
            return int(fence)

    # --8<-- [end:acquire]

    # --8<-- [start:release]
    def release(self, name: str, token: str) -> bool:
        """Compare-and-delete: only the holder whose token matches frees the name."""
        with self._transaction() as db:
            sql = "DELETE FROM multilock_holders WHERE name = ? AND token = ?"
            return db.execute(sql, (name, token)).rowcount == 1

    def extend(self, name: str, token: str, ttl: float) -> bool:
        """Compare-and-extend: push the expiry, if ``token`` still holds an unexpired lease."""
        now = time.time()
        with self._transaction() as db:
            sql = (
                "UPDATE multilock_holders SET expires = ?"
                " WHERE name = ? AND token = ? AND expires > ?"
            )
            return db.execute(sql, (now + ttl, name, token, now)).rowcount == 1

    # --8<-- [end:release]

    def holders(self) -> list[LockInfo]:
        """Every unexpired holder in the database."""
        with self._transaction() as db:
            rows = db.execute(
                "SELECT name, token, expires FROM multilock_holders WHERE expires > ?"
                " ORDER BY name",
                (time.time(),),
            ).fetchall()
        return [
            LockInfo(
                key=name,
                name=name,
                holder=token,
                expires_at=datetime.fromtimestamp(expires, UTC),
            )
            for name, token, expires in rows
        ]

    def close(self) -> None:
        """Close the connection (held rows stay until their expiry or release)."""
        with self._guard:
            self._db.close()
