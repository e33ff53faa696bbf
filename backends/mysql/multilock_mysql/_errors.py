"""The one place where the drivers' errors become multilock's (aiomysql raises PyMySQL's)."""

from __future__ import annotations

import pymysql

from multilock.backend import LockURL
from multilock.errors import BackendUnavailable, ConfigurationError, MultilockError

from ._sql import FenceTable

__all__ = ["ACCESS_DENIED", "driver_error", "fencing_error", "is_unavailable", "redact"]

ACCESS_DENIED = frozenset({1044, 1045, 1142, 1143, 1227, 1370})
"""Server error codes that mean "this user may not": database, login, table, column,
operation, routine."""

# Client-side codes (CR_*) of a connection that could not be made or was lost (2026: no
# TLS where the URL insists on it), and the server's codes for a session ended under it
# (shutdown, KILL, idle timeouts).
_GONE = frozenset({2002, 2003, 2005, 2006, 2013, 2026, 2055, 1053, 1077, 1152, 1927, 4031})


def redact(url: LockURL, text: str) -> str:
    """``text`` with the URL's password hidden, given in the netloc or as ``?password=``."""
    text = url.redact(text)
    given = url.options.get("password")
    return text.replace(given, "***") if isinstance(given, str) and given else text


def _code(exc: BaseException) -> int | None:
    args = getattr(exc, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def is_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` says the server could not be asked (as opposed to refused)."""
    if isinstance(exc, pymysql.err.InterfaceError | OSError | TimeoutError):
        return True
    return isinstance(exc, pymysql.err.OperationalError) and _code(exc) in _GONE


def driver_error(url: LockURL, exc: BaseException, doing: str) -> MultilockError:
    """The multilock error for ``exc``, raised while ``doing`` something, password hidden.

    A server that cannot be reached or a session lost is
    :class:`~multilock.errors.BackendUnavailable`; anything the server refused is a
    plain :class:`~multilock.errors.MultilockError`. Raise it ``from None``: the
    driver's exception may carry connection details.
    """
    code = _code(exc)
    text = exc.args[1] if code is not None and len(exc.args) > 1 else str(exc)
    cause = exc.__cause__
    if isinstance(cause, OSError) and str(cause) and str(cause) not in str(text):
        # aiomysql's "Can't connect" keeps the reason (a refused certificate...) only here.
        text = f"{text} ({cause})"
    detail = redact(url, str(text).strip()) or type(exc).__name__
    tail = f" [MySQL error {code}]" if code else ""
    message = f"MySQL at {url.masked}: {doing} failed: {detail}{tail}"
    if is_unavailable(exc):
        return BackendUnavailable(message)
    return MultilockError(message)


def fencing_error(url: LockURL, table: FenceTable, exc: BaseException) -> MultilockError:
    """The error for a sequence table that cannot be made or used: what to do about it."""
    if _code(exc) in ACCESS_DENIED:
        return ConfigurationError(
            f"MySQL at {url.masked}: fencing=true needs the sequence table {table} and this"
            f" user may not create or update it. Have an administrator run: CREATE TABLE"
            f" {table.quoted} (id TINYINT UNSIGNED NOT NULL PRIMARY KEY, value BIGINT UNSIGNED NOT"
            f" NULL) ENGINE=InnoDB; INSERT INTO {table.quoted} VALUES (1, 0); GRANT SELECT, UPDATE"
            f" ON {table.quoted} TO <user> -- or name another with ?fencing_table=."
            f" ({redact(url, str(exc.args[-1]).strip())})"
        )
    return driver_error(url, exc, f"preparing the sequence table {table}")
