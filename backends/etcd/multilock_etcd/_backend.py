"""The backend object that the ``etcd`` entry point resolves to."""

from __future__ import annotations

from multilock.backend import LockURL

from ._async.locker import AsyncEtcdLocker
from ._common import EtcdHooks
from ._sync.locker import EtcdLocker

__all__ = ["EtcdBackend", "backend"]


class EtcdBackend:
    """``etcd://host:2379,host:2379/prefix`` URLs."""

    conformance = EtcdHooks()

    def connect(self, url: LockURL) -> EtcdLocker:
        """A sync locker (it connects on first use)."""
        return EtcdLocker(url)

    def connect_async(self, url: LockURL) -> AsyncEtcdLocker:
        """An async locker (it connects on first use, in the running loop)."""
        return AsyncEtcdLocker(url)


backend = EtcdBackend()
"""The instance registered under the ``etcd`` scheme."""
