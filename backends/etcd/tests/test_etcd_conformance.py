"""The conformance suite, against etcd: sync and async, every check."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from multilock.testing import ConformanceTests, server_url

# The default ttl of the suite's leases: a crashed holder's lock is free again after it
# (rounded up to etcd's whole seconds), and a lease broken on the server is noticed by
# the watch at once.
TTL = "2s"


class TestEtcdConformance(ConformanceTests):
    """Every promise of the contract, kept by ``etcd://``."""

    @pytest.fixture
    def multilock_url(self, make_url: Callable[..., str], request: pytest.FixtureRequest) -> str:
        """The shared test server, a prefix of the test's own, a short default ttl."""
        return server_url(request.config, make_url(ttl=TTL))
