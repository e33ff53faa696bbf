"""Server URLs for tests: reachable, or skipped -- or failed when backends are required."""

from __future__ import annotations

import os

import pytest

import multilock
import multilock.backend
from multilock.errors import BackendUnavailable, MissingBackend, MultilockError

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

    A server that cannot be reached, or a backend distribution that is not
    installed, skips the test with the reason -- or fails it when backends are
    required, so that a missing server can never pass CI as a skip. A URL that
    is wrong (bad option, unknown scheme) always fails. The probe runs once per
    URL and session.
    """
    cache = config.stash.setdefault(_PROBED, {})
    if url not in cache:
        cache[url] = _probe(url)
    problem = cache[url]
    if problem is not None:
        message, can_skip = problem
        if can_skip and not require_backends(config):
            pytest.skip(message)
        pytest.fail(message, pytrace=False)
    return url


def _probe(url: str) -> tuple[str, bool] | None:
    masked = multilock.backend.mask_url(url)
    try:
        with multilock.connect(url) as locker:
            lease = locker.try_acquire("multilock-conformance-probe")
            if lease is not None:
                lease.release()
    except (BackendUnavailable, MissingBackend) as exc:
        return f"backend {masked} is not reachable: {exc}", True
    except MultilockError as exc:
        return f"backend {masked} is not usable: {exc}", False
    return None


_PROBED = pytest.StashKey[dict[str, tuple[str, bool] | None]]()
