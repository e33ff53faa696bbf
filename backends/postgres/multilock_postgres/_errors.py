"""The one place where psycopg's errors become multilock's."""

from __future__ import annotations

import psycopg

from multilock.backend import LockURL
from multilock.errors import BackendUnavailable, MultilockError

__all__ = ["driver_error"]


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
    detail = url.redact(str(exc).strip()) or type(exc).__name__
    message = f"PostgreSQL at {url.masked}: {doing} failed: {detail}{state}"
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        return BackendUnavailable(message)
    return MultilockError(message)
