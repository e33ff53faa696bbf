"""The module the plugin collects when given ``--multilock-url``: the suite, per URL."""

from __future__ import annotations

import pytest

from ._conformance import ConformanceTests
from ._servers import server_url

__all__ = ["TestMultilockConformance"]


class TestMultilockConformance(ConformanceTests):
    """The conformance suite against each ``--multilock-url`` (parametrized by the plugin)."""

    @pytest.fixture
    def multilock_url(self, request: pytest.FixtureRequest) -> str:
        """The URL of this parametrization, if its backend answers."""
        url: str = request.param
        return server_url(request.config, url)
