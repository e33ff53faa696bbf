"""The conformance suite, against NATS JetStream: sync and async, every check."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from multilock.testing import ConformanceTests, server_url

# The default ttl of the suite's leases, and the TTL of the bucket the test creates: a
# crashed holder's lock is free again after it, and a purged key is noticed at the next
# renewal (every third of it).
TTL = "2s"


class TestNatsConformance(ConformanceTests):
    """Every promise of the contract, kept by ``nats://``."""

    @pytest.fixture
    def multilock_url(self, make_url: Callable[..., str], request: pytest.FixtureRequest) -> str:
        """The shared test server, a bucket of the test's own with a short TTL."""
        return server_url(request.config, make_url(ttl=TTL))
