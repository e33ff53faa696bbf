"""The one place where psycopg's errors become multilock's."""

from __future__ import annotations

import psycopg

from multilock.backend import LockURL
from multilock.errors import BackendUnavailable, ConfigurationError, MultilockError

__all__ = ["check_sequence", "driver_error", "fencing_error", "redact"]


def redact(url: LockURL, text: str) -> str:
    """``text`` with the URL's password hidden, given in the netloc or as ``?password=``."""
    text = url.redact(text)
    given = url.options.get("password")
    return text.replace(given, "***") if isinstance(given, str) and given else text


def driver_error(url: LockURL, exc: psycopg.Error, doing: str) -> MultilockError:
    """The multilock error for ``exc``, raised while ``doing`` something, password hidden.

    Connection-level failures (refused, timed out, dropped, server shutting
    down) are :class:`~multilock.errors.BackendUnavailable`; anything else the
    server refused (a missing privilege, say) is a plain
    :class:`~multilock.errors.MultilockError`. Raise it ``from None``: the
    driver's exception may carry connection details in its text.
    """
    sqlstate = getattr(exc, "sqlstate", None)
    state = f" [SQLSTATE {sqlstate}]" if sqlstate else ""
    detail = redact(url, str(exc).strip()) or type(exc).__name__
    message = f"PostgreSQL at {url.masked}: {doing} failed: {detail}{state}"
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        return BackendUnavailable(message)
    return MultilockError(message)


def fencing_error(url: LockURL, sequence: str | None, exc: psycopg.Error) -> MultilockError:
    """The error for a fencing sequence that cannot be made or used: what to do about it."""
    if isinstance(exc, psycopg.errors.InsufficientPrivilege):
        return ConfigurationError(
            f"PostgreSQL at {url.masked}: fencing=true needs the sequence {sequence!r} and"
            f" this role may not create it. Have an administrator run: CREATE SEQUENCE"
            f" {sequence} AS bigint CACHE 1; GRANT USAGE ON SEQUENCE {sequence} TO <role>"
            f" -- or name another with ?fencing_sequence=. ({redact(url, str(exc).strip())})"
        )
    return driver_error(url, exc, f"preparing the fencing sequence {sequence!r}")


def check_sequence(sequence: str, row: tuple[object, ...] | None) -> None:
    """Refuse a fencing sequence whose tokens would not increase across sessions, or
    that this role cannot use (``row``: its cache size and our USAGE privilege)."""
    if row is None:
        raise psycopg.errors.UndefinedObject(f"sequence {sequence!r} does not exist")
    cache, usable = row
    if not usable:
        raise psycopg.errors.InsufficientPrivilege(f"no USAGE privilege on sequence {sequence!r}")
    if cache != 1:
        raise ConfigurationError(
            f"fencing sequence {sequence!r} has CACHE {cache}; it needs CACHE 1, or each"
            f" session hands out its own block and tokens stop increasing across holders"
            f" (ALTER SEQUENCE {sequence} CACHE 1)"
        )
