"""Server URLs for tests: reachable, or skipped -- or failed when backends are required."""

from __future__ import annotations

import os

import pytest

import multilock
import multilock.backend
from multilock.errors import BackendUnavailable, MultilockError

__all__ = ["require_backends", "server_url"]

REQUIRE_ENV = "MULTILOCK_REQUIRE_BACKENDS"


def require_backends(config: pytest.Config) -> bool:
    """Whether a missing server fails the run (``--multilock-require-backends``,
    or ``MULTILOCK_REQUIRE_BACKENDS=1``; CI sets it) instead of skipping."""
    if config.getoption("multilock_require_backends", default=False):
        return True
    return os.environ.get(REQUIRE_ENV, "").strip().lower() in ("1", "true", "yes", "all")


def server_url(config: pytest.Config, url: str) -> str:
    """Return ``url`` if its backend answers a probe acquire/release.

    Otherwise skip the test with the reason -- or fail it when backends are
    required, so that a missing server can never pass CI as a skip.
    """
    try:
        with multilock.connect(url) as locker:
            lease = locker.try_acquire("multilock-conformance-probe")
            if lease is not None:
                lease.release()
    except (BackendUnavailable, MultilockError) as exc:
        message = f"backend {multilock.backend.mask_url(url)} is not usable: {exc}"
        if require_backends(config):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return url
