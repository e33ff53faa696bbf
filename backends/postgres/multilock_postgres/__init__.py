"""multilock-postgres: the PostgreSQL backend of multilock.

Leases are session advisory locks (``pg_try_advisory_lock`` on the name's
:func:`multilock.advisory_key`) held on one dedicated connection per locker.
Installed, it serves ``postgresql://`` and ``postgres://`` URLs::

    import multilock

    with multilock.connect("postgresql://app@db/app?fencing=true") as locker:
        with locker.try_acquire("nightly-reindex") as lease:
            ...

See the documentation page "PostgreSQL backend" for options and guarantees.
"""

from __future__ import annotations

from ._async.locker import AsyncPostgresLease, AsyncPostgresLocker
from ._backend import PostgresBackend, backend
from ._sync.locker import PostgresLease, PostgresLocker

__all__ = [
    "AsyncPostgresLease",
    "AsyncPostgresLocker",
    "PostgresBackend",
    "PostgresLease",
    "PostgresLocker",
    "backend",
]

__version__ = "0.1.0"
