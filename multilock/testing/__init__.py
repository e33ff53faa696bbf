"""The conformance suite, shipped with the core as a pytest plugin.

Inert until asked: ``pytest --multilock-url=URL`` (repeatable, or the
``MULTILOCK_URL`` environment variable) runs the suite against each URL, and
backend authors mix :class:`ConformanceTests` into their own tests (the
fsspec pattern), supplying a ``multilock_url`` fixture::

    from multilock.testing import ConformanceTests, server_url

    class TestMyConformance(ConformanceTests):
        @pytest.fixture
        def multilock_url(self, request: pytest.FixtureRequest) -> str:
            return server_url(request.config, "mylock://127.0.0.1/")

See :mod:`multilock.testing.plugin` and ``docs/conformance.md``.
"""

from __future__ import annotations

from ._conformance import ConformanceTests
from ._harness import Harness
from ._servers import require_backends, server_url

__all__ = ["ConformanceTests", "Harness", "require_backends", "server_url"]
