"""The backend object that the ``nats`` entry point resolves to, and its conformance hooks."""

from __future__ import annotations

import socket

from multilock.backend import LockURL

from ._client import Client
from ._config import NatsConfig
from ._locker import AsyncNatsLocker, NatsLocker
from ._portal import Portal

__all__ = ["NatsBackend", "NatsHooks", "backend"]

_EXPIRY_SLACK = 0.25
"""The server removes an expired message a moment after its age passes the TTL."""


class NatsHooks:
    """Conformance hooks of the NATS backend."""

    def crash_release_bound(self, url: LockURL, ttl: float) -> float:
        """A dead holder's key expires the bucket's TTL after its last renewal."""
        client = Client(NatsConfig.from_url(url))
        portal = Portal("multilock-nats-hooks")
        try:
            portal.call(client.ready(), 30.0)
            assert client.max_age is not None
            return client.max_age + _EXPIRY_SLACK
        finally:
            portal.stop(client.close())

    def break_lease(self, url: LockURL, locker: object, lease: object) -> None:
        """Purge the lease's key from another connection; its next renewal is refused."""
        client = Client(NatsConfig.from_url(url))
        portal = Portal("multilock-nats-hooks")
        try:
            portal.call(client.purge(lease._subject), 30.0)  # type: ignore[attr-defined]
        finally:
            portal.stop(client.close())

    def unreachable_url(self, url: LockURL) -> str | None:
        """A nats:// URL on a local port nobody listens on (refused at once)."""
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        return f"nats://127.0.0.1:{port}/unreachable"


class NatsBackend:
    """``nats://host:4222,host:4222/bucket`` URLs (NATS JetStream key-value buckets)."""

    conformance = NatsHooks()

    def connect(self, url: LockURL) -> NatsLocker:
        """A sync locker (it connects on first use, in a thread of its own)."""
        return NatsLocker(url)

    def connect_async(self, url: LockURL) -> AsyncNatsLocker:
        """An async locker (it connects on first use, in the running loop)."""
        return AsyncNatsLocker(url)


backend = NatsBackend()
"""The instance registered under the ``nats`` scheme."""
