"""Redis with Sentinel (``redis+sentinel://``): the conformance suite against the
primary the Sentinels name."""

from __future__ import annotations

from typing import Any

import pytest

from multilock.testing import ConformanceTests, server_url

pytestmark = pytest.mark.topology

TTL = "2s"  # as the one-server suite's (test_redis_conformance.py)


class TestRedisSentinelConformance(ConformanceTests):
    """Every promise of the contract, kept by ``redis+sentinel://``."""

    @pytest.fixture
    def multilock_url(self, redis_sentinels: Any, request: pytest.FixtureRequest) -> str:
        """The test's own primary behind three Sentinels, with a short default ttl."""
        return server_url(request.config, f"{redis_sentinels.url}?ttl={TTL}")
