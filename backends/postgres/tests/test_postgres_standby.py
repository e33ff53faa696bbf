"""A PostgreSQL primary with a streaming standby, and a multi-host URL naming both
(``target_session_attrs=read-write``, the default with several hosts): the
conformance suite over it, and the primary killed and the standby promoted.

Advisory locks live in the primary's memory and are not replicated: on the promoted
standby nobody holds anything. What must hold is the order: the holder learns that
its lease is lost before another replica can take the name on the new primary, no
lock is ever taken on a standby, and the fencing sequence, replicated synchronously,
never hands out a smaller token after the failover.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import pytest

import multilock
from multilock.errors import BackendUnavailable
from multilock.testing import ConformanceTests
from multilock.testing import poll as _poll
from multilock.testing._servers.postgres import ReplicatedPair

pytestmark = pytest.mark.topology

BOUND = 30.0  # seconds any transition may take before the test fails (loaded machine)


@pytest.fixture(scope="module")
def pair(replicated_pair: Callable[..., ReplicatedPair]) -> ReplicatedPair:
    """One pair for the whole suite."""
    return replicated_pair()


class TestReplicatedConformance(ConformanceTests):
    """Every promise of the contract over the multi-host URL of a primary and its standby,
    with fencing."""

    @pytest.fixture
    def multilock_url(self, pair: ReplicatedPair) -> str:
        """Both hosts, fencing, a short health interval."""
        return f"{pair.url}?fencing=true&health_interval=0.5"


def test_the_primary_killed_and_the_standby_promoted(
    replicated_pair: Callable[..., ReplicatedPair],
) -> None:
    pair = replicated_pair()
    assert pair.standby is not None
    url = f"{pair.url}?fencing=true&health_interval=1&connect_timeout=2"
    name = f"failover-{uuid.uuid4().hex}"
    with multilock.connect(url) as holder, multilock.connect(url) as other:
        lease = holder.try_acquire(name)
        assert lease is not None
        assert other.try_acquire(name) is None
        killed = time.monotonic()
        pair.primary.kill()
        assert lease.lost.wait(BOUND), "the holder was not told"
        lost_after = time.monotonic() - killed
        # No primary: the standby refuses to be the lock server (read-only), it never
        # grants a lock nobody else can see.
        with pytest.raises(BackendUnavailable, match=r"read-only|read-write|hot standby"):
            other.try_acquire(name)
        promoting = time.monotonic()
        pair.standby.promote()
        promoted_after = time.monotonic() - promoting
        taken = _poll("the name on the new primary", lambda: other.try_acquire(name), BOUND)
        taken_after = time.monotonic() - killed
        assert taken.fencing_token is not None
        assert lease.fencing_token is not None
        assert taken.fencing_token > lease.fencing_token
        assert lease.release() is False  # the stale lease frees nothing
        assert holder.try_acquire(name) is None  # the old holder reconnects, to the new primary
        assert taken.release() is True
    print(
        f"\nprimary killed: lost after {lost_after * 1000:.0f} ms; promotion took"
        f" {promoted_after:.2f}s; the name taken {taken_after:.2f}s after the kill"
    )
