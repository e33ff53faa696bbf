"""The ``postgresql://`` backend object the entry points resolve to, and its test hooks."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, urlencode, urlsplit, urlunsplit

import psycopg

from multilock.backend import LockURL

from ._async.locker import AsyncPostgresLocker
from ._config import Settings, parse_settings
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

    @contextlib.contextmanager
    def degraded(self, url: LockURL, state: str) -> Iterator[str | None]:
        """``refusing``: a role that may not connect (CONNECTION LIMIT 0), made and
        dropped with the URL's own role where it may create roles. ``busy`` (with
        ``fencing=true``): a peer holds a lock on the fencing sequence that ``nextval``
        waits for, past ``lock_timeout``. Advisory locks are taken in read-only
        transactions too: ``read-only`` does not apply."""
        settings = parse_settings(url)
        if state == "refusing":
            role = f"multilock_refused_{uuid.uuid4().hex[:12]}"
            try:
                with _admin(settings) as admin:
                    admin.execute(f"CREATE ROLE {role} LOGIN CONNECTION LIMIT 0")
            except psycopg.Error:  # no CREATEROLE: this state cannot be made here
                yield None
                return
            try:
                yield _with_user(url, role)
            finally:
                with _admin(settings) as admin:
                    admin.execute(f"DROP ROLE IF EXISTS {role}")
        elif state == "busy" and settings.fencing_sequence is not None:
            with PostgresLocker(url) as locker:  # makes the sequence if it is missing
                lease = locker.try_acquire(f"multilock-degraded-{uuid.uuid4().hex}")
                if lease is not None:
                    lease.release()
            with _admin(settings, autocommit=False) as peer:
                peer.execute(f"ALTER SEQUENCE {settings.fencing_sequence} CACHE 1")
                try:
                    yield url.raw
                finally:
                    peer.rollback()
        else:
            yield None

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


def _admin(settings: Settings, autocommit: bool = True) -> psycopg.Connection[Any]:
    """A connection of the URL's own role, for the hooks' own statements."""
    return psycopg.Connection.connect(
        settings.conninfo, password=settings.password, autocommit=autocommit
    )


def _with_user(url: LockURL, user: str) -> str:
    """``url`` with another user and no password (the hooks' throwaway roles)."""
    parts = urlsplit(url.raw)
    _, _, hosts = parts.netloc.rpartition("@")
    return urlunsplit(parts._replace(netloc=f"{quote(user, safe='')}@{hosts}"))


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
