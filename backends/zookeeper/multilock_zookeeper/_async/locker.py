"""The async ``zookeeper://`` locker and lease (the source the sync ones are generated from).

Only the flow lives here: send requests (``Session``), wait for them
(``async_settle``), interpret them (``Session`` again). An acquire is one
ephemeral create; ``try_acquire_many`` sends all its creates before waiting
for any, so a batch costs one round trip's worth of latency. The async API's
single acquire and release mostly skip this flow for a cheaper one that does
not wait in a task (``_started``).
"""

from __future__ import annotations

from multilock.abc import LockInfo
from multilock.backend import AsyncLeaseBase, AsyncLockerBase, LockURL

from .._batch import Node
from .._bridge import async_settle, async_stop
from .._capabilities import CAPABILITIES
from .._claims import TickClaims
from .._config import Config
from .._session import Session
from .._started import AsyncStartedLease, AsyncStartedLocker
from .._watches import AsyncZooKeeperWatch

__all__ = ["AsyncZooKeeperLease", "AsyncZooKeeperLocker"]


class AsyncZooKeeperLease(AsyncStartedLease, AsyncLeaseBase):
    """A lease of the ``zookeeper://`` backend: an ephemeral node of our session.

    ``fencing_token`` is the node's creation zxid; ``expires_at`` is ``None``
    (the lease lasts as long as the session).
    """

    __slots__ = ("_node", "_session")

    def __init__(self, session: Session, node: Node) -> None:
        super().__init__(node.name, node.path, node.token, node.czxid)
        self._session = session
        self._node = node

    async def _release(self) -> bool:
        request = self._session.delete(self._node)
        if request is None:
            return self._node.closed
        await async_settle(request, self._session.deadline())
        return self._session.deleted(self._node, request)

    async def _extend(self, ttl: float | None) -> float | None:
        # Session-bound: nothing to push back, but confirm the node is still ours.
        request = self._session.check(self._node)
        await async_settle(request, self._session.deadline())
        self._session.checked(self._node, request)
        return None


class AsyncZooKeeperLocker(AsyncStartedLocker, AsyncLockerBase):
    """The async locker of ``zookeeper://host:port,.../chroot`` (one kazoo session)."""

    capabilities = CAPABILITIES
    # Far below ZooKeeper's request limit (jute.maxbuffer, 1 MiB by default), which a
    # create of an escaped name may triple: past it, the server drops the connection.
    max_name_length = 32 * 1024

    def __init__(self, url: LockURL) -> None:
        config = Config.from_url(url)
        super().__init__(url, default_ttl=config.ttl)
        self._session = Session(config)

    @property
    def session_id(self) -> int | None:
        """The current ZooKeeper session id, or ``None`` while there is none."""
        client_id = self._session.client.client_id
        return client_id[0] if client_id else None

    async def _try_acquire(self, name: str, ttl: float) -> AsyncLeaseBase | None:
        leases = await self._acquire([name])
        return leases[name]

    async def _try_acquire_many(
        self, names: list[str], ttl: float
    ) -> dict[str, AsyncLeaseBase | None]:
        return await self._acquire(names)

    async def _acquire(self, names: list[str]) -> dict[str, AsyncLeaseBase | None]:
        await self._connected()
        batch = self._session.create(names)
        try:
            for request in batch.pending:
                await async_settle(request, batch.deadline)
        except BaseException:
            batch.abandon()
            raise
        return batch.finish(self._lease)

    async def _claim_ticks(self, names: list[str], fires: list[int]) -> list[bool]:
        await self._connected()
        claims = TickClaims(self._session, names, fires)
        while requests := claims.send():
            deadline = self._session.deadline()
            for request in requests:
                await async_settle(request, deadline)
            claims.interpret()
        return claims.result()

    def _lease(self, node: Node) -> AsyncLeaseBase:
        return AsyncZooKeeperLease(self._session, node)

    async def _connected(self) -> None:
        waiting = self._session.connecting()
        if waiting is not None:
            await async_settle(waiting, self._session.deadline())
            self._session.check_connected()

    async def locks(self) -> list[LockInfo]:
        """The locks held under this locker's chroot, by any client, with their holders."""
        await self._connected()
        listing = self._session.list_locks()
        deadline = self._session.deadline()
        await async_settle(listing, deadline)
        reads = self._session.read_locks(listing)
        for _, request in reads:
            await async_settle(request, deadline)
        return self._session.lock_infos(reads)

    def watch_released(self, name: str) -> AsyncZooKeeperWatch:
        """A watch woken when the name's lock node changes (a holder's node deleted)."""
        session = self._session
        return AsyncZooKeeperWatch(session.watches, session.lock_path(name), session.deadline)

    async def _close(self) -> None:
        for lease in self._session.closing():
            await lease.release()
        await async_stop(self._session.stop)
