"""The conformance suite, sync and async, against the test server: with fencing off
(the default) and on, since the suite gates its fencing checks on it."""

from __future__ import annotations

import pytest

from multilock.testing import ConformanceTests

from .conftest import with_options


class TestMySQLConformance(ConformanceTests):
    """mysql:// with the default options (no fencing)."""

    @pytest.fixture
    def multilock_url(self, mysql_url: str) -> str:
        """The test server's URL; a short health interval keeps lost-signal checks fast."""
        return with_options(mysql_url, health_interval="0.5s")


class TestMySQLFencingConformance(ConformanceTests):
    """mysql:// with ``fencing=true``."""

    @pytest.fixture
    def multilock_url(self, mysql_url: str) -> str:
        """The test server's URL with fencing tokens from the default sequence table."""
        return with_options(mysql_url, health_interval="0.5s", fencing=True)
