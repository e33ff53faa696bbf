"""A 3-node ZooKeeper ensemble: the conformance suite over it, and its leader killed.

The ensemble is three servers of ``scripts/zookeeper.sh`` on loopback (the
``zookeeper_ensemble`` fixture), and the URL names all three. Killing the leader
(SIGKILL) drops every client connection of the ensemble, followers' too: the
followers stop serving until they have elected a new leader. A lease rides that
with ``suspended=keep`` (same session, same node) when the client is back within
the grace; with ``suspended=lost`` (the default) it is given up at once and its
node deleted once the client is back, so another replica can take the name.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import multilock
from multilock.testing import ConformanceTests, server_url
from multilock.testing import poll as _poll
from multilock.testing._servers.zookeeper import PrivateZooKeeper, ZooKeeperEnsemble
from multilock_zookeeper._config import KEEP_GRACE_SHARE

pytestmark = pytest.mark.topology

BOUND = 30.0  # seconds any transition may take before the test fails (three JVMs, 2 cores)
SESSION_TIMEOUT = 10.0  # the backend's default: what riding a leader change is measured at
GRACE = SESSION_TIMEOUT * KEEP_GRACE_SHARE


def poll(what: str, probe: Callable[[], Any], within: float = BOUND) -> Any:
    """Poll ``probe`` with this module's bound (see multilock.testing.poll)."""
    return _poll(what, probe, within, 0.01)


class TestZooKeeperEnsembleConformance(ConformanceTests):
    """Every promise of the contract, kept by ``zookeeper://`` over a 3-node ensemble."""

    @pytest.fixture
    def multilock_url(
        self, zookeeper_ensemble: ZooKeeperEnsemble, request: pytest.FixtureRequest
    ) -> str:
        """The ensemble with a short session timeout (a crashed holder frees in seconds)."""
        return server_url(request.config, f"{zookeeper_ensemble.url()}?session_timeout=2s")


class Killed:
    """The leader a test killed, and when."""

    def __init__(self, ensemble: ZooKeeperEnsemble) -> None:
        self.ensemble = ensemble
        self.member: PrivateZooKeeper | None = None
        self.at = 0.0

    def __call__(self) -> float:
        """SIGKILL the ensemble's leader; when (monotonic)."""
        self.member = self.ensemble.members[self.ensemble.leader()]
        self.at = time.monotonic()
        os.kill(self.member.pid(), signal.SIGKILL)
        return self.at

    def survivors(self) -> list[PrivateZooKeeper]:
        """The members not killed."""
        return [member for member in self.ensemble.members if member is not self.member]


@pytest.fixture
def kill_leader(zookeeper_ensemble: ZooKeeperEnsemble) -> Iterator[Killed]:
    """``kill_leader()``: SIGKILL the ensemble's leader (see :class:`Killed`). The member
    is started again after the test, which waits until the ensemble is whole."""
    killed = Killed(zookeeper_ensemble)
    yield killed
    if killed.member is not None:
        killed.member.stop()  # forget the dead process, then start it on its data
        killed.member.start()
    zookeeper_ensemble.wait_serving(BOUND)


def test_suspended_keep_rides_a_leader_change(
    zookeeper_ensemble: ZooKeeperEnsemble, kill_leader: Killed
) -> None:
    """The holder keeps its session and its node through the election: no ``lost``, the
    node unchanged, nobody else can take the name, and a later holder's token is larger."""
    url = f"{zookeeper_ensemble.url('/ride')}?suspended=keep&connect_timeout=2"
    with multilock.connect(url) as holder, multilock.connect(url) as other:
        lease = poll("the first acquire", lambda: holder.try_acquire("job"))
        session = holder.session_id  # type: ignore[attr-defined]
        killed_at = kill_leader()
        zookeeper_ensemble.wait_serving(BOUND, kill_leader.survivors())
        elected = time.monotonic() - killed_at
        # Nobody can take the name during or after the election: the node is still there.
        assert poll("another locker's answer", lambda: other.try_acquire("job") is None)
        poll("the holder back", holder.locks)  # type: ignore[attr-defined]
        back = time.monotonic() - killed_at
        assert not lease.lost.is_set(), f"lost fired: {lease.lost.reason}"
        assert holder.session_id == session  # type: ignore[attr-defined]
        lease.extend()  # the same node, the same czxid, still ours
        assert other.try_acquire("job") is None
        assert lease.release() is True
        again = poll("the name free after release", lambda: other.try_acquire("job"))
        assert again.fencing_token > lease.fencing_token
        again.release()
    print(f"\nleader killed: new leader after {elected:.2f}s, holder back after {back:.2f}s")
    assert back < GRACE, f"the holder was back after {back:.2f}s, past the grace {GRACE:g}s"


def test_suspended_lost_gives_the_lease_up_at_a_leader_change(
    zookeeper_ensemble: ZooKeeperEnsemble, kill_leader: Killed
) -> None:
    """The default policy: ``lost`` as soon as the connection drops; once the holder is
    back it deletes the node it gave up, so another locker takes the name, with a larger
    fencing token, long before the session would time out."""
    url = f"{zookeeper_ensemble.url('/give-up')}?connect_timeout=2"
    with multilock.connect(url) as holder, multilock.connect(url) as other:
        lease = poll("the first acquire", lambda: holder.try_acquire("job"))
        session = holder.session_id  # type: ignore[attr-defined]
        killed_at = kill_leader()
        assert lease.lost.wait(BOUND), "lost did not fire at the leader change"
        lost_after = time.monotonic() - killed_at
        taken = poll("another locker taking the name", lambda: other.try_acquire("job"))
        taken_after = time.monotonic() - killed_at
        assert holder.session_id == session  # type: ignore[attr-defined]
        assert taken.fencing_token > lease.fencing_token
        assert lease.release() is False  # the stale lease frees nothing
        assert taken.release() is True
    print(f"\nleader killed: lost after {lost_after:.3f}s, name taken after {taken_after:.2f}s")
    assert lost_after < 1.0, f"lost after {lost_after:.2f}s: a dropped connection fires it at once"
    assert taken_after < SESSION_TIMEOUT
