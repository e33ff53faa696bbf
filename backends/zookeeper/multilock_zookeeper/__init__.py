"""multilock's ZooKeeper backend: ``zookeeper://host1:2181,host2:2181/chroot`` (or ``zk://``).

A lock is one plain ephemeral znode under the chroot, created in one round
trip; its creation zxid is the fencing token; it lives as long as the
locker's kazoo session. See the documentation page "ZooKeeper backend".
"""

from __future__ import annotations

from ._async.locker import AsyncZooKeeperLease, AsyncZooKeeperLocker
from ._backend import ZooKeeperBackend, backend
from ._sync.locker import ZooKeeperLease, ZooKeeperLocker

__all__ = [
    "AsyncZooKeeperLease",
    "AsyncZooKeeperLocker",
    "ZooKeeperBackend",
    "ZooKeeperLease",
    "ZooKeeperLocker",
    "backend",
]

__version__ = "0.1.0"
