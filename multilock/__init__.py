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

One replica leading the others, for work that is not a scheduled job::

    async with multilock.leadership(locker, "ingest-leader") as lead:
        await lead.elected  # until this replica is elected
        while lead.is_leader:
            await ingest_batch()

Backend authors find their kit in :mod:`multilock.backend`, the contract in
:mod:`multilock.abc` and the conformance suite in :mod:`multilock.testing`.
"""

from __future__ import annotations

from . import errors
from ._locks.holds import AsyncHold, Hold, hold
from ._locks.keys import advisory_key
from ._locks.registry import connect, connect_async, installed_schemes, register_backend
from ._scheduling.clock import Clock, ManualClock, SystemClock
from ._scheduling.events import EventKind, JobEvent
from ._scheduling.jobs import Job, RunContext, current_run
from ._scheduling.leadership import AsyncLeadership, Leadership, leadership
from ._scheduling.per_tick import once_per_tick
from ._scheduling.scheduler import Scheduler
from ._scheduling.triggers import Trigger, cron, daily, every, monthly, once, weekly
from ._signal import LostSignal
from .abc import AsyncDistributedLock, AsyncLease, Capability, DistributedLock, Lease

__all__ = [
    "AsyncDistributedLock",
    "AsyncHold",
    "AsyncLeadership",
    "AsyncLease",
    "Capability",
    "Clock",
    "DistributedLock",
    "EventKind",
    "Hold",
    "Job",
    "JobEvent",
    "Leadership",
    "Lease",
    "LostSignal",
    "ManualClock",
    "RunContext",
    "Scheduler",
    "SystemClock",
    "Trigger",
    "advisory_key",
    "connect",
    "connect_async",
    "cron",
    "current_run",
    "daily",
    "errors",
    "every",
    "hold",
    "installed_schemes",
    "leadership",
    "monthly",
    "once",
    "once_per_tick",
    "register_backend",
    "weekly",
]

__version__ = "0.1.0"
