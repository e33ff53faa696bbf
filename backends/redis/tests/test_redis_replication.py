"""Redis replicates asynchronously: a failover can lose a lock that the primary had
granted. Shown with a measured case, and the mitigation, ``wait_replicas``, with its
cost.

The replica runs in a network namespace of the test's own, so that its link to the
primary can be cut (packets dropped, nothing closed): what the primary grants then
never reaches it, deterministically. The primary is then killed and Sentinel
promotes the replica. The numbers are printed as ``measured:`` lines (``pytest -s``).
"""

from __future__ import annotations

import statistics
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import multilock
from multilock.errors import BackendUnavailable
from multilock.testing import poll
from multilock.testing._servers.redis import Sentinels
from multilock_redis import RedisLease, fence_key, lock_key

from .netns import Link, Namespace
from .test_redis_failover import PROMOTION_WITHIN, report

pytestmark = [pytest.mark.topology, pytest.mark.slow]

TTL = 15.0  # renewed every 5 s: long after the failover, as with the default 30 s


class CutOff:
    """A primary and three Sentinels on the host, and its replica in a namespace whose
    link to the host the test can cut."""

    def __init__(self, sentinels: Sentinels, namespace: Namespace, link: Link) -> None:
        self.sentinels = sentinels
        self.namespace = namespace
        self.link = link

    def crash_primary(self) -> None:
        """Kill the primary as a crashed machine dies, its replica still cut off.

        A killed process's kernel would go on sending what the replica had not
        acknowledged once the link heals (an orphaned socket): the replica first
        drops its connection to the primary, from inside its namespace, so that
        those bytes meet a closed socket there.
        """
        self.sentinels.primary.stop()
        replica = self.sentinels.replicas[0]
        command = ("redis-cli", "-h", replica.host, "-p", str(replica.port))
        subprocess.run(
            self.namespace.command(*command, "CLIENT", "KILL", "TYPE", "master"),
            check=True,
            capture_output=True,
            timeout=10,
        )
        self.link.heal()


@pytest.fixture
def cut_off(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[CutOff]:
    """A :class:`CutOff` set-up of the test's own."""
    namespace = Namespace(request.config)
    try:
        link = namespace.link()
        sentinels = Sentinels(
            tmp_path,
            primary_host=link.host_ip,
            replica_host=link.ns_ip,
            replica_prefix=namespace.command(),
        )
        try:
            sentinels.start(request.config)
            yield CutOff(sentinels, namespace, link)
        finally:
            sentinels.remove()
    finally:
        namespace.remove()


def _held(lease: object) -> RedisLease:
    assert isinstance(lease, RedisLease), f"expected a lease, got {lease!r}"
    return lease


def _copied(sentinels: Sentinels, name: str, token: int) -> bool:
    with sentinels.replicas[0].admin() as replica:
        copied: bytes | None = replica.get(fence_key(name))
    return copied == str(token).encode()


def test_async_replication_can_lose_a_granted_lock(cut_off: CutOff) -> None:
    """The engine's own loss case: a lock granted by a primary that dies before its
    replica has it is gone after the failover. Another replica takes the name while
    the first still holds its lease, with the same fencing token."""
    sentinels, link = cut_off.sentinels, cut_off.link
    url = f"{sentinels.url}?ttl={TTL}s&socket_timeout=1s"
    with multilock.connect(url) as holder, multilock.connect(url) as other:
        warm = _held(holder.try_acquire("warm"))
        poll("the replica copies the primary", lambda: _copied(sentinels, "warm", 1), 5.0)
        link.cut()  # from now on, what the primary writes never reaches the replica
        lease = _held(holder.try_acquire("job"))
        lost: list[float] = []
        lease.lost.add_callback(lambda reason: lost.append(time.monotonic()))
        killed = time.monotonic()
        cut_off.crash_primary()
        sentinels.wait_promoted(sentinels.primary, PROMOTION_WITHIN)
        promoted = time.monotonic()
        taken = _held(poll("another locker takes the name", lambda: other.try_acquire("job"), 10))
        taken_at = time.monotonic()
        poll("the holder is told its lease is lost", lease.lost.is_set, TTL)
        assert not warm.lost.is_set()  # it had been copied: it survives the failover
    assert taken_at < lost[0], "the first holder knew before the second took the name"
    assert taken.fencing_token == lease.fencing_token, "a fencing token handed out twice"
    report(
        "async replication loses a lock (Sentinel, replica's link cut, primary killed)",
        promotion=promoted - killed,
        taken_after=taken_at - killed,
        holder_told_after=lost[0] - killed,
        both_held_for=lost[0] - taken_at,
        fencing_tokens=(lease.fencing_token, taken.fencing_token),
    )


def test_wait_replicas_never_grants_what_no_replica_has(cut_off: CutOff) -> None:
    """With ``wait_replicas=1``, a grant the replica did not acknowledge is undone and
    refused, and a renewal it did not acknowledge does not count: the lease is lost
    by its last replicated expiry while the primary still answers. Its cost, on a
    healthy link, is measured first."""
    sentinels, link = cut_off.sentinels, cut_off.link
    url = f"{sentinels.url}?ttl={TTL}s&socket_timeout=1s"
    waited = f"{url}&wait_replicas=1&wait_timeout=200ms"
    with multilock.connect(url) as plain, multilock.connect(waited) as holder:
        costs = _cycle_costs(plain, holder, "cost", rounds=300)
        kept = _held(holder.try_acquire("kept", ttl=2.0))
        assert _copied(sentinels, "kept", 1)  # acknowledged: copied before the grant
        link.cut()
        start = time.monotonic()
        with pytest.raises(BackendUnavailable, match="wait_replicas") as refused:
            holder.try_acquire("job")
        refused_after = time.monotonic() - start
        with sentinels.primary.admin() as primary:
            assert primary.get(lock_key("job")) is None  # undone on the primary
        poll("the unconfirmed lease is lost", kept.lost.is_set, 2.0 + 1.0)
        lost_after = time.monotonic() - start
        cut_off.crash_primary()
        sentinels.wait_promoted(sentinels.primary, PROMOTION_WITHIN)
        taken = _held(poll("the name is free", lambda: plain.try_acquire("job"), 10))
    assert "acknowledged" in str(refused.value)
    report(
        "wait_replicas=1 (Sentinel, replica's link cut)",
        acquire_release_us=costs[0],
        with_wait_us=costs[1],
        refused_after=refused_after,
        unconfirmed_lease_lost_after=lost_after,
        next_fencing_token=taken.fencing_token,
    )


def _cycle_costs(plain: Any, waited: Any, name: str, rounds: int) -> tuple[float, float]:
    """Median µs of an uncontended acquire + release, without and with ``WAIT``
    (interleaved, so that load on the machine hits both alike)."""
    samples: tuple[list[float], list[float]] = ([], [])
    for _ in range(rounds):
        for i, locker in enumerate((plain, waited)):
            start = time.perf_counter()
            _held(locker.try_acquire(name)).release()
            samples[i].append((time.perf_counter() - start) * 1e6)
    return statistics.median(samples[0]), statistics.median(samples[1])
