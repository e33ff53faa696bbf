"""The one place kazoo's failures become multilock errors."""

from __future__ import annotations

from kazoo.exceptions import (
    AuthFailedError,
    ConnectionClosedError,
    ConnectionLoss,
    KazooException,
    NoAuthError,
    OperationTimeoutError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError

from multilock.backend import LockURL
from multilock.errors import BackendUnavailable, MultilockError

__all__ = ["OUTCOME_UNKNOWN", "shown", "unavailable"]

OUTCOME_UNKNOWN = (ConnectionLoss, KazooTimeoutError, OperationTimeoutError)
"""Failures after which the server may or may not have applied the request."""


def shown(text: str, limit: int = 80) -> str:
    """``repr(text)`` for a message, cut short: lock names may be kilobytes long."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[: limit - 20]!r}... ({len(text)} characters)"


def unavailable(
    url: LockURL, doing: str, exc: BaseException | None = None, *, last: str | None = None
) -> MultilockError:
    """Map a kazoo failure (or a timeout, when ``exc`` is ``None``: ``last`` then is
    kazoo's last warning, if any) while ``doing`` something to
    :class:`BackendUnavailable`, password masked.

    Errors that are not about reaching the server (a bug, a bad argument) are not
    disguised as unavailability: they come back as a plain :class:`MultilockError`.
    """
    where = f"ZooKeeper at {url.masked}"
    if exc is None and last:
        why = f"no connection (kazoo: {url.redact(last)})"
    elif exc is None or isinstance(exc, OUTCOME_UNKNOWN):
        why = "no answer (connection lost or timed out)"
    elif isinstance(exc, SessionExpiredError):
        why = "the session expired"
    elif isinstance(exc, ConnectionClosedError):
        why = "the client is closed"
    elif isinstance(exc, NoAuthError | AuthFailedError):
        why = "not authorized (check the username/password and the chroot's ACL)"
    elif isinstance(exc, KazooException | OSError):
        why = url.redact(f"{type(exc).__name__}: {exc}".rstrip(": "))
    else:
        return MultilockError(url.redact(f"{doing} on {where} failed: {exc!r}"))
    return BackendUnavailable(f"{doing} on {where} failed: {why}")
