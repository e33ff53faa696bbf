"""The backend object that the ``multilock.backends`` entry points resolve to."""

from __future__ import annotations

from multilock.backend import LockURL

from ._async._locker import AsyncRedisLocker
from ._common import RedisHooks
from ._sync._locker import RedisLocker

__all__ = ["RedisBackend", "backend"]


class RedisBackend:
    """``redis://``, ``rediss://`` (TLS) and ``unix://`` / ``redis+unix://`` (socket) URLs."""

    conformance = RedisHooks()

    def connect(self, url: LockURL) -> RedisLocker:
        """A sync locker (it connects on first use)."""
        return RedisLocker(url)

    def connect_async(self, url: LockURL) -> AsyncRedisLocker:
        """An async locker (it connects on first use, in the running loop)."""
        return AsyncRedisLocker(url)


backend = RedisBackend()
"""The instance registered under every Redis URL scheme."""
