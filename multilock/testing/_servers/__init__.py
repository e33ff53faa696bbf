"""Servers for tests: the shared ones' URLs, reachable or skipped -- or failed when
backends are required -- and, in the submodules, private servers a test may break.

The submodules (:mod:`.postgres`, :mod:`.zookeeper`, :mod:`.redis`, :mod:`.mysql`,
:mod:`.etcd`, :mod:`.nats`; :mod:`.process` and :mod:`.checks` for what they share) are
the repository's test support, not an API: every distribution's tests import them, and
each imports its server's driver, so nothing imports them but those tests.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

import multilock
import multilock.backend
from multilock.errors import BackendUnavailable, MissingBackend, MultilockError

__all__ = ["require_backends", "server_url", "unavailable"]

REQUIRE_ENV = "MULTILOCK_REQUIRE_BACKENDS"


def require_backends(config: pytest.Config) -> bool:
    """Whether a missing server fails the run (``--multilock-require-backends``,
    or ``MULTILOCK_REQUIRE_BACKENDS=1``; CI sets it) instead of skipping."""
    if config.getoption("multilock_require_backends", default=False):
        return True
    return os.environ.get(REQUIRE_ENV, "").strip().lower() in ("1", "true", "yes", "all")


def unavailable(config: pytest.Config, message: str) -> NoReturn:
    """Skip the test for a missing server or tool -- or fail it when backends are
    required (CI), so that nothing missing passes as a skip."""
    if require_backends(config):
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


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
        if not can_skip:
            pytest.fail(message, pytrace=False)
        unavailable(config, message)
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
