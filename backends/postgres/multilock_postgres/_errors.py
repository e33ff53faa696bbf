"""The one place where psycopg's errors become multilock's."""

from __future__ import annotations

from typing import Any

import psycopg

from multilock.backend import LockURL
from multilock.errors import BackendUnavailable, ConfigurationError, MultilockError

__all__ = ["check_sequence", "driver_error", "fencing_error", "redact"]


def redact(url: LockURL, text: str) -> str:
    """``text`` with the URL's password hidden, given in the netloc or as ``?password=``."""
    text = url.redact(text)
    given = url.options.get("password")
    return text.replace(given, "***") if isinstance(given, str) and given else text


def driver_error(
    url: LockURL, exc: psycopg.Error, doing: str, cut_after: float | None = None
) -> MultilockError:
    """The multilock error for ``exc``, raised while ``doing`` something, password hidden;
    ``cut_after``: the seconds after which a deadline cut the connection, the real cause.

    Connection-level failures (refused, timed out, dropped, server shutting
    down) are :class:`~multilock.errors.BackendUnavailable`; anything else the
    server refused (a missing privilege, say) is a plain
    :class:`~multilock.errors.MultilockError`. Raise it ``from None``: the
    driver's exception may carry connection details in its text.
    """
    if cut_after is not None:
        return BackendUnavailable(
            f"PostgreSQL at {url.masked}: {doing} failed: no answer within {cut_after:g} s"
        )
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
            f" {sequence} AS bigint CACHE 1; ALTER SEQUENCE {sequence} OWNER TO <role>"
            f" -- or name another with ?fencing_sequence=. ({redact(url, str(exc).strip())})"
        )
    return driver_error(url, exc, f"preparing the fencing sequence {sequence!r}")


def check_sequence(url: LockURL, sequence: str, row: tuple[Any, ...] | None) -> tuple[str, str]:
    """Refuse a fencing sequence whose tokens another role could rewind, that would not
    increase across sessions, or that this role cannot use (``row``: the look-up of
    ``_sql.ensure_sequence``); return its schema and name."""
    if row is None:
        raise psycopg.errors.UndefinedObject(f"sequence {sequence!r} does not exist")
    schema, name, kind, cache, owned, owner, role, usable, writers = row
    qualified = f"{schema}.{name}"
    where = f"PostgreSQL at {url.masked}: fencing sequence {qualified}"
    if kind != "S":
        raise ConfigurationError(f"{where} is not a sequence (relkind {kind!r})")
    if not owned:
        raise ConfigurationError(
            f"{where} is owned by role {owner!r}, not by {role!r}: another role could rewind"
            f" its tokens (setval). Make this role its owner (ALTER SEQUENCE {qualified}"
            f" OWNER TO {role}) or name another with ?fencing_sequence="
        )
    if writers:
        raise ConfigurationError(
            f"{where} may be rewound (setval) by {writers}, which were granted UPDATE on it"
            f" (REVOKE UPDATE ON SEQUENCE {qualified} FROM {writers})"
        )
    if not usable:
        raise psycopg.errors.InsufficientPrivilege(f"no USAGE privilege on sequence {qualified}")
    if cache != 1:
        raise ConfigurationError(
            f"{where} has CACHE {cache}; it needs CACHE 1, or each session hands out its own"
            f" block and tokens stop increasing across holders (ALTER SEQUENCE {qualified}"
            f" CACHE 1)"
        )
    return schema, name
