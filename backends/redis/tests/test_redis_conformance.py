"""The conformance suite, against Redis: sync and async, every check."""

from __future__ import annotations

import pytest

from multilock.testing import ConformanceTests, server_url

# The default ttl of the suite's leases. Renewal runs every third of it, and a
# lease broken on the server is noticed at the next renewal: a short ttl keeps
# that (and a crashed holder's release, which takes a ttl) within seconds.
TTL = "2s"


class TestRedisConformance(ConformanceTests):
    """Every promise of the contract, kept by ``redis://``."""

    @pytest.fixture
    def multilock_url(self, redis_url: str, request: pytest.FixtureRequest) -> str:
        """The shared test server, with a short default ttl."""
        separator = "&" if "?" in redis_url else "?"
        return server_url(request.config, f"{redis_url}{separator}ttl={TTL}")
