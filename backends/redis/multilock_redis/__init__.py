"""multilock's Redis backend: ``SET key token NX PX ttl`` leases, renewed while held.

Installed with ``pip install 'multilock[redis]'``; used through a URL::

    import multilock

    with multilock.connect("redis://cache:6379/0?ttl=30s") as locker:
        lease = locker.try_acquire("nightly-reindex")

Each acquire is one script call that also bumps the name's fencing counter;
release and extend compare the owner token first. See ``docs/backends/redis.md``.
"""

from __future__ import annotations

from ._async._locker import AsyncRedisLease, AsyncRedisLocker
from ._backend import RedisBackend, backend
from ._keys import fence_key, lock_key
from ._sync._locker import RedisLease, RedisLocker

__all__ = [
    "AsyncRedisLease",
    "AsyncRedisLocker",
    "RedisBackend",
    "RedisLease",
    "RedisLocker",
    "backend",
    "fence_key",
    "lock_key",
]

__version__ = "0.1.0"
