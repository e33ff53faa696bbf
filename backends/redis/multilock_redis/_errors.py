"""The one place where redis-py's errors become multilock's."""

from __future__ import annotations

import ssl

from redis import exceptions as rex

from multilock.backend import LockURL
from multilock.errors import BackendUnavailable, InvalidURL, MultilockError

__all__ = ["REDIS_ERRORS", "translate"]

REDIS_ERRORS = (rex.RedisError, OSError, rex.RedisClusterException)
"""What a Redis call may raise; ``except REDIS_ERRORS as exc: raise translate(...)``.
(redis-py's cluster errors that are not answers of a server -- no node reachable, a
slot no primary serves -- are not ``RedisError``s.)"""

# Refusals that mean "ask again later or elsewhere", not "you asked wrongly".
_TRANSIENT = (rex.ReadOnlyError, rex.ClusterDownError, rex.TryAgainError, rex.OutOfMemoryError)


def translate(exc: BaseException, url: LockURL, doing: str) -> MultilockError:
    """The multilock error for ``exc``, raised while ``doing`` against ``url``.

    Connection, timeout, TLS and authentication failures, a server still loading
    or a replica refusing writes are :class:`BackendUnavailable`: the backend
    could not be asked. Any other refusal is a :class:`MultilockError` with the
    server's message. The password never appears.
    """
    detail = url.redact(str(exc)) or type(exc).__name__
    tls = _tls_failure(exc)
    if tls is not None and tls not in detail:
        detail = f"{detail} ({tls})"
    message = f"redis at {url.masked} failed while {doing}: {detail}"
    if isinstance(exc, rex.ResponseError) and "DB index is out of range" in str(exc):
        # SELECT refused: the URL names a database the server does not have. Bad input.
        db = url.options.get("db") or url.path.strip("/")
        return InvalidURL(f"invalid Redis URL {url.masked!r}: the server has no db {db}")
    if isinstance(exc, rex.ResponseError) and not isinstance(exc, _TRANSIENT):
        return MultilockError(message)
    # The rest, a RedisClusterException included (no node reachable, a slot no primary
    # serves, a node not in cluster mode): the cluster could not be asked.
    return BackendUnavailable(message)


def _tls_failure(exc: BaseException) -> str | None:
    """The TLS error behind ``exc``, if any: some redis-py versions (5.0's asyncio
    client) word a failed handshake as "Error 1 connecting to host:port. 1." only."""
    cause = exc.__cause__ or exc.__context__
    for _ in range(8):  # a chain is short; never loop on a pathological one
        if cause is None:
            return None
        if isinstance(cause, ssl.SSLError):
            return str(cause)
        cause = cause.__cause__ or cause.__context__
    return None
