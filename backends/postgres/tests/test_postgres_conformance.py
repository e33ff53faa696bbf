"""The conformance suite, sync and async, against the local PostgreSQL server: with
fencing off (the default) and on, since the suite gates its fencing checks on it."""

from __future__ import annotations

import pytest

from multilock.testing import ConformanceTests


class TestPostgresConformance(ConformanceTests):
    """postgresql:// with the default options (no fencing)."""

    @pytest.fixture
    def multilock_url(self, postgres_url: str) -> str:
        """The test server's URL; a short health interval keeps lost-signal checks fast."""
        return f"{postgres_url}{'&' if '?' in postgres_url else '?'}health_interval=0.5"


class TestPostgresFencingConformance(ConformanceTests):
    """postgresql:// with ``fencing=true``."""

    @pytest.fixture
    def multilock_url(self, postgres_url: str) -> str:
        """The test server's URL with fencing tokens from the default sequence."""
        sep = "&" if "?" in postgres_url else "?"
        return f"{postgres_url}{sep}health_interval=0.5&fencing=true"
