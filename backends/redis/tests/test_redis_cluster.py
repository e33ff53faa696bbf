"""Redis Cluster (``redis+cluster://``): the conformance suite, and what only a cluster
has -- names spread over slots and primaries."""

from __future__ import annotations

from typing import Any

import pytest

from multilock.testing import ConformanceTests, server_url

pytestmark = pytest.mark.topology

TTL = "2s"  # as the one-server suite's (test_redis_conformance.py)


class TestRedisClusterConformance(ConformanceTests):
    """Every promise of the contract, kept by ``redis+cluster://``."""

    @pytest.fixture
    def multilock_url(self, redis_cluster: Any, request: pytest.FixtureRequest) -> str:
        """The test's own cluster, with a short default ttl."""
        return server_url(request.config, f"{redis_cluster.url}?ttl={TTL}")
