"""multilock's etcd backend: a key per lock on a kept-alive etcd lease, fenced by its
create revision.

Installed with ``pip install 'multilock[etcd]'``; used through a URL::

    import multilock

    with multilock.connect("etcd://etcd-0:2379,etcd-1:2379/app-locks?ttl=30s") as locker:
        lease = locker.try_acquire("nightly-reindex")

Each acquire is one transaction "create the key if it does not exist" on the locker's
etcd lease; release is a compare-and-delete on the key's create revision, which is
also the fencing token. It talks to etcd's v3 JSON gateway over HTTP (h11), so it
needs no gRPC or protobuf. See ``docs/backends/etcd.md``.
"""

from __future__ import annotations

from ._async.locker import AsyncEtcdLease, AsyncEtcdLocker
from ._backend import EtcdBackend, backend
from ._sync.locker import EtcdLease, EtcdLocker

__all__ = [
    "AsyncEtcdLease",
    "AsyncEtcdLocker",
    "EtcdBackend",
    "EtcdLease",
    "EtcdLocker",
    "backend",
]

__version__ = "0.1.0"
