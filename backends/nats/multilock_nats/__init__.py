"""multilock's NATS JetStream backend: a key per lock in a KV bucket, fenced by its revision.

Installed with ``pip install 'multilock[nats]'``; used through a URL::

    import multilock

    with multilock.connect("nats://nats-0:4222,nats-1:4222/locks?ttl=30s") as locker:
        lease = locker.try_acquire("nightly-reindex")

Each acquire is one publish that JetStream stores only if the key has no message; its
revision is the fencing token. Leases are renewed by writing the key again (the bucket's
TTL runs from the last write); release purges the key up to our revision. Built on
nats-py, which is asyncio only: the sync API runs it in a thread of its own. See
``docs/backends/nats.md``.
"""

from __future__ import annotations

from ._backend import NatsBackend, NatsHooks, backend
from ._keys import escape, unescape
from ._locker import AsyncNatsLease, AsyncNatsLocker, NatsLease, NatsLocker

__all__ = [
    "AsyncNatsLease",
    "AsyncNatsLocker",
    "NatsBackend",
    "NatsHooks",
    "NatsLease",
    "NatsLocker",
    "backend",
    "escape",
    "unescape",
]

__version__ = "0.1.0"
