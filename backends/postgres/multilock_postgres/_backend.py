"""The ``postgresql://`` backend object the entry points resolve to, and its test hooks."""

from __future__ import annotations

from urllib.parse import quote, urlencode

import psycopg

from multilock.backend import LockURL

from ._async.locker import AsyncPostgresLocker
from ._config import parse_settings
from ._errors import driver_error
from ._sync.locker import PostgresLocker

__all__ = ["PostgresBackend", "backend"]

_CLOSED_PORT = 1  # tcpmux: privileged and unused, so a connection is refused at once


class _PostgresHooks:
    """What the conformance suite needs beyond the contract."""

    def crash_release_bound(self, url: LockURL, ttl: float) -> float:
        # The server ends a session the moment its client's socket closes.
        return 0.0

    def break_lease(self, url: LockURL, locker: object, lease: object) -> None:
        pid = getattr(locker, "session_pid", None)
        if pid is None:
            raise ValueError(f"{locker!r} has no PostgreSQL session to terminate")
        terminate(url, pid)

    def unreachable_url(self, url: LockURL) -> str:
        # Built from the parsed parts, not the raw text: a password with '/', '?' or
        # '#' in it would cut a pattern over the raw URL in the wrong place.
        userinfo = ""
        if url.username is not None:
            userinfo = quote(url.username, safe="")
            if url.password is not None:
                userinfo += ":" + quote(url.password, safe="")
            userinfo += "@"
        options = [
            (k, str(v)) for k, v in url.options.items() if k not in ("connect_timeout", "host")
        ]
        options.append(("connect_timeout", "1"))
        host = url.host or "127.0.0.1"
        host = host.join("[]") if ":" in host else host
        path = quote(url.path or "/", safe="/")
        return f"{url.scheme}://{userinfo}{host}:{_CLOSED_PORT}{path}?{urlencode(options)}"


def terminate(url: LockURL, pid: int) -> bool:
    """End server process ``pid`` from a separate connection to ``url``'s database,
    waiting (up to 5 s) until it is gone and its locks with it."""
    settings = parse_settings(url)
    try:
        with psycopg.Connection.connect(settings.conninfo, **settings.connect_kwargs()) as conn:
            row = conn.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,)).fetchone()
    except psycopg.Error as exc:
        raise driver_error(url, exc, "terminating a session") from None
    return bool(row and row[0])


class PostgresBackend:
    """The backend of ``postgresql://`` and ``postgres://`` URLs (an entry point each)."""

    conformance = _PostgresHooks()

    def connect(self, url: LockURL) -> PostgresLocker:
        """A sync locker; it connects on first use."""
        return PostgresLocker(url)

    def connect_async(self, url: LockURL) -> AsyncPostgresLocker:
        """An async locker; it connects on first use."""
        return AsyncPostgresLocker(url)


backend = PostgresBackend()
"""The backend instance the entry points name."""
