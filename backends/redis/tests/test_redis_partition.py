"""A partition: the holder of a lock, in a network namespace of the test's own, is cut
off from the Redis that holds the lock (packets dropped, nothing closed) while it can
still reach the resource it protects.

Checked: the holder's ``lost`` fires within the documented bound (the lease's ttl
after the cut: it is told by its last confirmed expiry), before another replica can
take the name; and the fenced resource -- a Redis list that refuses a write whose
fencing token is older than one it has seen -- takes no write of the stale holder
after the new holder's first, though the stale holder goes on trying for a second.
The numbers are printed as ``measured:`` lines (``pytest -s``).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

import multilock
from multilock.testing import poll
from multilock.testing._servers.redis import RedisServer
from multilock_redis import RedisLease

from .netns import Link, Namespace
from .partition_holder import RESOURCE_KEYS, fenced_write
from .test_redis_failover import report

pytestmark = pytest.mark.topology

TTL = 1.0
SLACK = 0.5  # scheduling on a loaded 2-core machine
STALE_FOR = 1.0  # seconds the cut-off holder goes on writing after it is told
HOLDER = Path(__file__).with_name("partition_holder.py")


class Partition:
    """The holder's namespace, its link to the lock's Redis (to cut) and to the
    resource's Redis (kept), and both servers on the host's ends of the links."""

    def __init__(self, namespace: Namespace, directory: Path) -> None:
        self.namespace = namespace
        self.lock_link: Link = namespace.link()
        self.resource_link: Link = namespace.link()
        (directory / "lock").mkdir()
        (directory / "resource").mkdir()
        self.lock = RedisServer(directory / "lock", host=self.lock_link.host_ip)
        self.resource = RedisServer(directory / "resource", host=self.resource_link.host_ip)


@pytest.fixture
def partition(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Partition]:
    """A :class:`Partition` of the test's own."""
    namespace = Namespace(request.config)
    try:
        made = Partition(namespace, tmp_path)
        try:
            made.lock.start()
            made.resource.start()
            yield made
        finally:
            made.lock.remove()
            made.resource.remove()
    finally:
        namespace.remove()


def test_a_cut_off_holder_is_told_first_and_fenced_out(partition: Partition) -> None:
    name = "fenced-job"
    lock_url = f"{partition.lock.url}?ttl={TTL}s&socket_timeout=300ms"
    resource_url = partition.resource.url
    holder = subprocess.Popen(
        partition.namespace.command(
            sys.executable, str(HOLDER), lock_url, resource_url, name, str(STALE_FOR)
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        held = holder.stdout.readline().split()
        assert held[:1] == ["held"], f"the holder did not start: {held} {holder.stderr}"
        old_token = int(held[1])
        time.sleep(3 * TTL / 3 + 0.1)  # a renewal has been confirmed: cut in a steady state
        cut = time.time()
        partition.lock_link.cut()
        with (
            multilock.connect(lock_url) as other,
            redis.Redis.from_url(resource_url, socket_timeout=1) as resource,
        ):
            lease = poll("the name is free again", lambda: other.try_acquire(name), 10 * TTL, 0.01)
            taken = time.time()
            assert isinstance(lease, RedisLease)
            new_token = lease.fencing_token or 0
            assert fenced_write(resource, new_token, "new")  # the new holder's first write
            first_write = time.time()
            ending = first_write + STALE_FOR + 2 * SLACK
            while time.time() < ending:
                assert fenced_write(resource, new_token, "new")
                time.sleep(0.02)
            log = [entry.decode().split() for entry in resource.lrange(RESOURCE_KEYS[1], 0, -1)]
        out, err = holder.communicate(timeout=30)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    lines = dict(line.split(maxsplit=1) for line in out.splitlines())
    assert "lost" in lines, f"the holder was never told: {out} {err}"
    lost = float(lines["lost"])
    refused = int(lines["refused"])

    assert lost - cut <= TTL + SLACK, f"told {lost - cut:.2f}s after the cut"
    assert lost <= taken, "another replica took the name before the holder was told"
    assert new_token > old_token
    firsts = [i for i, (token, _, _) in enumerate(log) if int(token) == new_token]
    late = [entry for entry in log[firsts[0] :] if int(entry[0]) == old_token]
    assert not late, f"stale writes landed after the new holder's first: {late}"
    assert refused > 0, "the stale holder never wrote after the new holder: nothing was fenced"
    report(
        "partition, redis (holder's link cut)",
        told_after_cut=lost - cut,
        taken_after_cut=taken - cut,
        told_before_taken=taken - lost,
        stale_writes_refused=refused,
        stale_writes_landed_after_new=len(late),
    )
