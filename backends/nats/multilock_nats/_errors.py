"""The one place where nats-py's failures become multilock errors."""

from __future__ import annotations

import ssl

import nats.errors
import nats.js.errors

from multilock.backend import LockURL
from multilock.errors import BackendUnavailable, MultilockError

__all__ = ["NATS_ERRORS", "WRONG_LAST_SEQUENCE", "NoTLS", "translate"]

NATS_ERRORS = (nats.errors.Error, OSError)
"""What a nats-py call may raise (its JetStream API errors are ``nats.errors.Error`` too;
``TimeoutError`` is an ``OSError``)."""
WRONG_LAST_SEQUENCE = 10071
"""JetStream's error code for a publish whose expected last subject sequence was not
the subject's: the key is held (or was renewed) by someone else."""


class NoTLS(nats.errors.Error):
    """The server's greeting does not require TLS, and the URL asks for it."""

    def __str__(self) -> str:
        return "the server does not offer TLS, which the URL asks for (tls=true)"


_UNAVAILABLE = (
    NoTLS,  # a server misconfigured, or a man in the middle: not the URL's fault
    nats.errors.TimeoutError,
    nats.errors.NoServersError,
    nats.errors.ConnectionClosedError,
    nats.errors.NoRespondersError,
    nats.errors.StaleConnectionError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.OutboundBufferLimitError,
    nats.js.errors.ServiceUnavailableError,
    nats.js.errors.ServerError,
    nats.js.errors.NoStreamResponseError,
    OSError,
)


def translate(exc: BaseException, url: LockURL, doing: str) -> MultilockError:
    """The multilock error for ``exc``, raised while ``doing`` against ``url``.

    No connection, a timeout, TLS refused, no JetStream answering: the server could not
    be asked (:class:`BackendUnavailable`). A refusal (authorization, a bad request) is
    a :class:`MultilockError` with the server's message. The password never appears.
    """
    detail = url.redact(str(exc)) or type(exc).__name__
    if isinstance(exc, TimeoutError | nats.errors.TimeoutError):
        detail = "no answer in time"
    tls = _tls_failure(exc)
    if tls is not None and tls not in detail:
        detail = f"{detail} ({tls})"
    message = f"nats at {url.masked} failed while {doing}: {detail}"
    if isinstance(exc, _UNAVAILABLE):
        return BackendUnavailable(message)
    return MultilockError(message)


def _tls_failure(exc: BaseException) -> str | None:
    cause: BaseException | None = exc
    for _ in range(8):  # a chain is short; never loop on a pathological one
        if cause is None:
            return None
        if isinstance(cause, ssl.SSLError):
            return str(cause)
        cause = cause.__cause__ or cause.__context__
    return None
