"""multilock-mysql: the MySQL and MariaDB backend of multilock.

Leases are user-level locks (``GET_LOCK(key, 0)``) held on one dedicated session
per locker; a name becomes its key by :func:`lock_key`. Installed, it serves
``mysql://`` and ``mariadb://`` URLs::

    import multilock

    with multilock.connect("mysql://app@db/app?fencing=true") as locker:
        with locker.try_acquire("nightly-reindex") as lease:
            ...

See the documentation page "MySQL and MariaDB backend" for options and guarantees.
"""

from __future__ import annotations

from ._async.locker import AsyncMySQLLease, AsyncMySQLLocker
from ._backend import MySQLBackend, backend
from ._keys import lock_key
from ._sync.locker import MySQLLease, MySQLLocker

__all__ = [
    "AsyncMySQLLease",
    "AsyncMySQLLocker",
    "MySQLBackend",
    "MySQLLease",
    "MySQLLocker",
    "backend",
    "lock_key",
]

__version__ = "0.1.0"
