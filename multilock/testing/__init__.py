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

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._conformance import ConformanceTests
    from ._harness import Harness
    from ._poll import apoll, poll
    from ._proxy import TcpProxy
    from ._servers import require_backends, server_url

__all__ = [
    "ConformanceTests",
    "Harness",
    "TcpProxy",
    "apoll",
    "poll",
    "require_backends",
    "server_url",
]

# Imported on first use: the suite's child processes import this package too,
# and must not pay for pytest on every start.
_HOMES = {
    "ConformanceTests": "._conformance",
    "Harness": "._harness",
    "apoll": "._poll",
    "poll": "._poll",
    "TcpProxy": "._proxy",
    "require_backends": "._servers",
    "server_url": "._servers",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(home, __name__), name)
