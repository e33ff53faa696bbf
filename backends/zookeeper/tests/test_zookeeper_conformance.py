"""The conformance suite, against ZooKeeper: sync and async, every check."""

from __future__ import annotations

import pytest

from multilock.testing import ConformanceTests, server_url

# Short enough that a crashed holder's lock frees within seconds (the bound the
# suite uses is the backend's crash_release_bound, derived from this).
SESSION_TIMEOUT = "2s"


class TestZooKeeperConformance(ConformanceTests):
    """Every promise of the contract, kept by ``zookeeper://``."""

    @pytest.fixture
    def multilock_url(self, zookeeper_url: str, request: pytest.FixtureRequest) -> str:
        """The test server with a short session timeout."""
        separator = "&" if "?" in zookeeper_url else "?"
        url = f"{zookeeper_url}{separator}session_timeout={SESSION_TIMEOUT}"
        return server_url(request.config, url)
