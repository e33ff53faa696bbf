"""The one place where transport failures and etcd's error answers become multilock's."""

from __future__ import annotations

import ssl

import h11

from multilock.backend import LockURL
from multilock.errors import BackendUnavailable, MultilockError

from ._streams import ConnectFailed

__all__ = [
    "NOT_SENT",
    "TRANSPORT_ERRORS",
    "GatewayError",
    "translate",
]

TRANSPORT_ERRORS = (OSError, EOFError, h11.ProtocolError)
"""What a request may raise before etcd answers (``TimeoutError`` and ``ssl.SSLError``
are ``OSError``; a connection closed mid-answer is an ``EOFError``)."""
NOT_SENT = (ConnectFailed,)
"""Failures after which the request surely was not applied (nothing reached etcd)."""

# gRPC status codes etcd answers with.
UNAUTHENTICATED = 16
NOT_FOUND = 5
_TRANSIENT = frozenset({1, 4, 8, 10, 14})  # cancelled, deadline, exhausted, aborted, unavailable


class GatewayError(Exception):
    """An error answer of etcd's gateway: its gRPC status code and message."""

    def __init__(self, code: int, message: str, status: int) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status

    @property
    def auth_expired(self) -> bool:
        """The token was refused: authenticate again, then repeat the request."""
        return self.code == UNAUTHENTICATED and "token" in self.message

    @property
    def lease_not_found(self) -> bool:
        """The request named a lease that has expired or was revoked."""
        return self.code == NOT_FOUND and "lease not found" in self.message


def translate(exc: BaseException, url: LockURL, doing: str) -> MultilockError:
    """The multilock error for ``exc``, raised while ``doing`` against ``url``.

    No connection, a timeout, TLS refused, or an answer that means "ask again later"
    (no leader, request timed out, too many requests) is :class:`BackendUnavailable`.
    Any other refusal (permission denied, an invalid request) is a
    :class:`MultilockError` with etcd's message. The password never appears.
    """
    where = f"etcd at {url.masked} failed while {doing}"
    if isinstance(exc, GatewayError):
        message = f"{where}: {url.redact(exc.message)}"
        if exc.code in _TRANSIENT or (exc.status >= 500 and exc.code == 0):
            return BackendUnavailable(message)
        return MultilockError(message)
    detail = url.redact(str(exc)) or type(exc).__name__
    tls = _tls_failure(exc)
    if tls is not None and tls not in detail:
        detail = f"{detail} ({tls})"
    if isinstance(exc, TimeoutError):
        detail = "no answer in time"
    return BackendUnavailable(f"{where}: {detail}")


def _tls_failure(exc: BaseException) -> str | None:
    cause: BaseException | None = exc
    for _ in range(8):  # a chain is short; never loop on a pathological one
        if cause is None:
            return None
        if isinstance(cause, ssl.SSLError):
            return str(cause)
        cause = cause.__cause__ or cause.__context__
    return None
