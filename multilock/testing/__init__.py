"""The conformance suite, shipped with the core as a pytest plugin.

Inert until asked: ``pytest --multilock-url=URL`` (repeatable, or the
``MULTILOCK_URL`` environment variable) runs the suite against each URL, and
backend authors mix its abstract test classes into their own tests (the
fsspec pattern). See :mod:`multilock.testing.plugin`.
"""

from __future__ import annotations

from ._servers import require_backends, server_url

__all__ = ["require_backends", "server_url"]
