"""The ``zookeeper://`` backend object and its conformance hooks."""

from __future__ import annotations

import socket

from multilock.backend import LockURL

from ._async.locker import AsyncZooKeeperLocker
from ._config import Config
from ._errors import unavailable
from ._expire import end_session
from ._sync.locker import ZooKeeperLocker

__all__ = ["ZooKeeperBackend", "backend"]


class _ZooKeeperHooks:
    def crash_release_bound(self, url: LockURL, ttl: float) -> float:
        # A dead holder's session expires after its timeout, at the server's next tick
        # (a tick is at most half the minimum session timeout); plus scheduling slack.
        return Config.from_url(url).session_timeout * 1.5 + 0.5

    def break_lease(self, url: LockURL, locker: object, lease: object) -> None:
        # End the holder's session as the server does when it expires: its connection
        # closes, and the session is gone when the holder reconnects (see _expire).
        client_id = locker._session.client.client_id  # type: ignore[attr-defined]
        if client_id is None:
            raise RuntimeError("the locker has no session to expire")
        try:
            end_session(Config.from_url(url), client_id)
        except OSError as exc:
            raise unavailable(url, "expiring a session", exc) from None

    def unreachable_url(self, url: LockURL) -> str | None:
        # A loopback port that was free a moment ago: connection refused at once.
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        return f"{url.scheme}://127.0.0.1:{port}{url.path}?connect_timeout=1"


class ZooKeeperBackend:
    """The ``zookeeper://`` and ``zk://`` backend (entry points of ``multilock.backends``)."""

    conformance = _ZooKeeperHooks()

    def connect(self, url: LockURL) -> ZooKeeperLocker:
        """A sync locker (connects on first use)."""
        return ZooKeeperLocker(url)

    def connect_async(self, url: LockURL) -> AsyncZooKeeperLocker:
        """An async locker (connects on first use, without blocking the loop)."""
        return AsyncZooKeeperLocker(url)


backend = ZooKeeperBackend()
