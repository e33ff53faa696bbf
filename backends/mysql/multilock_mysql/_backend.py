"""The ``mysql://`` backend object the entry points resolve to, and its test hooks."""

from __future__ import annotations

import re

import pymysql

from multilock.backend import LockURL

from ._async.locker import AsyncMySQLLocker
from ._config import parse_settings
from ._errors import driver_error
from ._runtime import connect, hang_up
from ._sync.locker import MySQLLocker

__all__ = ["MySQLBackend", "backend", "kill"]

_CLOSED_PORT = 1  # tcpmux: privileged and unused, so a connection is refused at once
_NETLOC = re.compile(r"^(?P<scheme>[^:]+://)(?P<user>[^@/?#]*@)?(?P<hosts>[^/?#]*)(?P<rest>.*)$")


class _MySQLHooks:
    """What the conformance suite needs beyond the contract."""

    def crash_release_bound(self, url: LockURL, ttl: float) -> float:
        # The server ends a session the moment its client's socket closes.
        return 0.0

    def break_lease(self, url: LockURL, locker: object, lease: object) -> None:
        connection = getattr(locker, "connection_id", None)
        if connection is None:
            raise ValueError(f"{locker!r} has no MySQL session to kill")
        kill(url, connection)

    def unreachable_url(self, url: LockURL) -> str:
        match = _NETLOC.match(url.raw)
        if match is None:  # a URL LockURL parsed always matches
            raise ValueError(f"cannot rewrite {url.masked!r}")
        path, _, query = match["rest"].partition("?")
        options = [p for p in query.split("&") if p and not p.startswith("connect_timeout=")]
        options.append("connect_timeout=1")
        host = url.host or "127.0.0.1"
        host = f"[{host}]" if ":" in host else host
        return (
            f"{match['scheme']}{match['user'] or ''}{host}:{_CLOSED_PORT}{path}?{'&'.join(options)}"
        )


def kill(url: LockURL, connection: int) -> None:
    """End session ``connection`` of ``url``'s server (``KILL CONNECTION``) from a
    connection of its own; its user-level locks go with it."""
    settings = parse_settings(url)
    try:
        conn = connect(settings)
    except pymysql.err.MySQLError as exc:
        raise driver_error(url, exc, "connecting to kill a session") from None
    try:
        with conn.cursor() as cursor:
            cursor.execute(f"KILL CONNECTION {int(connection)}")
    except pymysql.err.MySQLError as exc:
        raise driver_error(url, exc, f"killing session {connection}") from None
    finally:
        hang_up(conn)


class MySQLBackend:
    """The backend of ``mysql://`` and ``mariadb://`` URLs (an entry point each)."""

    conformance = _MySQLHooks()

    def connect(self, url: LockURL) -> MySQLLocker:
        """A sync locker; it connects on first use."""
        return MySQLLocker(url)

    def connect_async(self, url: LockURL) -> AsyncMySQLLocker:
        """An async locker; it connects on first use."""
        return AsyncMySQLLocker(url)


backend = MySQLBackend()
"""The backend instance the entry points name."""
