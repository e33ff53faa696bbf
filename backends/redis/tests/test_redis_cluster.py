"""Redis Cluster (``redis+cluster://``): the conformance suite, and what only a cluster
has -- names spread over slots and primaries."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest

import multilock
from multilock.errors import BackendUnavailable
from multilock.testing import ConformanceTests, server_url
from multilock_redis import RedisLease, RedisLocker, lock_key

pytestmark = pytest.mark.topology

TTL = "2s"  # as the one-server suite's (test_redis_conformance.py)


class TestRedisClusterConformance(ConformanceTests):
    """Every promise of the contract, kept by ``redis+cluster://``."""

    @pytest.fixture
    def multilock_url(self, redis_cluster: Any, request: pytest.FixtureRequest) -> str:
        """The test's own cluster, with a short default ttl."""
        return server_url(request.config, f"{redis_cluster.url}?ttl={TTL}")


def test_many_names_over_every_primary_are_granted_renewed_listed_and_freed(
    redis_cluster: Any,
) -> None:
    # A cluster runs a script on one slot only: a batch is split by slot, and so
    # are renewal and release. 300 names cover every primary.
    # A ttl a loaded CI host can renew in time (at 600 ms, renewals late by a loaded
    # second let all 300 keys expire together once, just before the listing).
    url = f"{redis_cluster.url}?ttl=1500ms"
    names = [f"spread-{uuid.uuid4().hex[:8]}-{i}" for i in range(300)]
    assert len({redis_cluster.primary_for(lock_key(name)).port for name in names}) == 3
    with multilock.connect(url) as holder, multilock.connect(url) as other:
        assert isinstance(other, RedisLocker)
        leases = holder.try_acquire_many(names)
        held = [lease for lease in leases.values() if isinstance(lease, RedisLease)]
        assert len(held) == len(names)
        assert {lease.fencing_token for lease in held} == {1}
        renewed_until = time.monotonic() + 2 * 1.5  # two ttls: renewed on every primary
        while time.monotonic() < renewed_until:
            assert not any(other.try_acquire_many(names).values())
            time.sleep(0.1)
        assert not any(lease.lost.is_set() for lease in held)
        listed = {info.name: info for info in other.locks() if info.name in leases}
        assert set(listed) == set(names)  # scanned on every primary
        assert {info.details["fencing_token"] for info in listed.values()} == {1}
    with multilock.connect(url) as after:  # the holder's close() freed all of them
        again = after.try_acquire_many(names)
        assert {lease.fencing_token for lease in again.values() if lease} == {2}
        assert len([lease for lease in again.values() if lease]) == len(names)


def test_a_server_not_in_cluster_mode_is_named(redis_url: str) -> None:
    address = redis_url.split("://", 1)[1].split("/", 1)[0]
    with (
        multilock.connect(f"redis+cluster://{address}/") as locker,
        pytest.raises(BackendUnavailable, match=r"[Cc]luster mode is not enabled"),
    ):
        locker.try_acquire("anything")


def test_wait_replicas_asks_each_primary_written_to(redis_cluster: Any) -> None:
    # WAIT counts the writes of its own connection: each primary a call wrote to is
    # asked, after them, on theirs. A replica that does not acknowledge (frozen
    # here) has its primary's grants undone and refused.
    url = f"{redis_cluster.url}?wait_replicas=1&wait_timeout=200ms&socket_timeout=1s"
    names = [f"wait-{uuid.uuid4().hex[:8]}-{i}" for i in range(30)]
    primary = redis_cluster.primary_for(lock_key(names[0]))
    replica = redis_cluster.replica_of(primary.port)
    assert replica is not None
    with multilock.connect(url) as locker:
        _held_lease(locker.try_acquire(names[0])).release()
        granted = locker.try_acquire_many(names)  # over every primary
        assert all(granted.values())
        locker.release_many(list(granted.values()))  # type: ignore[attr-defined]
        replica.freeze()
        try:
            with pytest.raises(BackendUnavailable, match="acknowledged the write"):
                locker.try_acquire(names[0])
            with pytest.raises(BackendUnavailable, match="acknowledged the write"):
                locker.try_acquire_many(names)
        finally:
            replica.thaw()
        with primary.admin() as admin:
            assert not admin.exists(lock_key(names[0]))  # undone
        assert all(locker.try_acquire_many(names).values())  # every name free again

    async def main() -> None:
        async with multilock.connect_async(url) as locker:
            lease = await locker.try_acquire(f"{names[0]}-async")
            assert lease is not None
            assert await lease.release()

    asyncio.run(main())


def _held_lease(lease: object) -> RedisLease:
    assert isinstance(lease, RedisLease), f"expected a lease, got {lease!r}"
    return lease
