"""multilock: run scheduled jobs exactly once across the replicas of a service.

The public API is what this module exports::

    import multilock

    with multilock.connect("postgresql://app@db/app") as locker:
        lease = locker.try_acquire("nightly-reindex", ttl="30s")
        if lease is None:
            ...  # another replica holds it: not an error
        else:
            with lease:
                reindex(fencing_token=lease.fencing_token)

Backend authors find their kit in :mod:`multilock.backend`, the contract in
:mod:`multilock.abc` and the conformance suite in :mod:`multilock.testing`.
"""

from __future__ import annotations

from . import errors
from ._keys import advisory_key
from ._registry import connect, connect_async, installed_schemes, register_backend
from ._signal import LostSignal
from .abc import AsyncDistributedLock, AsyncLease, Capability, DistributedLock, Lease

__all__ = [
    "AsyncDistributedLock",
    "AsyncLease",
    "Capability",
    "DistributedLock",
    "Lease",
    "LostSignal",
    "advisory_key",
    "connect",
    "connect_async",
    "errors",
    "installed_schemes",
    "register_backend",
]

__version__ = "0.1.0"
