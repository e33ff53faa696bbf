"""Redis with Sentinel (``redis+sentinel://``): the conformance suite against the
primary the Sentinels name."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

import multilock
from multilock.testing import ConformanceTests, server_url

pytestmark = pytest.mark.topology

TTL = "2s"  # as the one-server suite's (test_redis_conformance.py)


class TestRedisSentinelConformance(ConformanceTests):
    """Every promise of the contract, kept by ``redis+sentinel://``."""

    @pytest.fixture
    def multilock_url(self, redis_sentinels: Any, request: pytest.FixtureRequest) -> str:
        """The test's own primary behind three Sentinels, with a short default ttl."""
        return server_url(request.config, f"{redis_sentinels.url}?ttl={TTL}")


def test_wait_replicas_loads_a_script_the_primary_lost(redis_sentinels: Any) -> None:
    # A promoted replica has no scripts: every request of a waited pipeline comes back
    # NOSCRIPT, the script is loaded and the pipeline sent again, WAIT included.
    url = f"{redis_sentinels.url}?wait_replicas=1&wait_timeout=500ms"
    name = f"flushed-{uuid.uuid4().hex[:8]}"
    with multilock.connect(url) as locker:
        for many in (False, True):
            with redis_sentinels.primary.admin() as primary:
                primary.script_flush()
            if many:
                leases = locker.try_acquire_many([f"{name}-{i}" for i in range(3)])
                assert all(leases.values())
            else:
                lease = locker.try_acquire(name)
                assert lease is not None
                assert lease.release()
