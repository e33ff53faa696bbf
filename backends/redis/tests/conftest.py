"""Fixtures of the Redis backend's tests, written as a third-party backend would.

``redis_url`` is the shared server (``MULTILOCK_REDIS_URL``), skipped when it is
down -- or failed when backends are required. ``throwaway_redis`` is a private
``redis-server`` on a free port that a test may stop, restart or kill clients of,
so that the shared server is never disturbed. The TLS servers present certificates
of a throwaway CA made by the repository's ``scripts/test-ca`` (``test_ca``).
The servers themselves are the repository's test support,
:mod:`multilock.testing._servers.redis`: these are only their fixtures.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from multilock.testing import server_url
from multilock.testing._servers.redis import Cluster, RedisServer, Sentinels

DEFAULT_URL = "redis://127.0.0.1:6379/15"
SECRET = "s3cret-pa55"


@pytest.fixture(scope="session")
def redis_url(pytestconfig: pytest.Config) -> str:
    """The shared Redis server's URL for these tests."""
    return server_url(pytestconfig, os.environ.get("MULTILOCK_REDIS_URL", DEFAULT_URL))


@pytest.fixture
def name() -> str:
    """A lock name no other test uses."""
    return f"test-{uuid.uuid4().hex}"


def _serve(directory: Path, password: str | None = None, **tls: Any) -> Iterator[RedisServer]:
    server = RedisServer(directory, password, **tls)
    try:
        server.start()
        yield server
    finally:
        server.remove()


@pytest.fixture
def throwaway_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A private redis-server on a free port and a Unix socket, killed after the test."""
    yield from _serve(tmp_path)


@pytest.fixture
def secured_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A private redis-server that wants the password in ``SECRET``."""
    yield from _serve(tmp_path, SECRET)


@pytest.fixture
def tls_redis(tmp_path: Path, test_ca: Path) -> Iterator[RedisServer]:
    """A private redis-server that speaks only TLS, with a certificate of the test CA
    for localhost and 127.0.0.1."""
    yield from _serve(tmp_path, tls=test_ca)


@pytest.fixture
def wrong_name_redis(tmp_path: Path, test_ca: Path) -> Iterator[RedisServer]:
    """As ``tls_redis``, with a certificate of the test CA for another name."""
    yield from _serve(tmp_path, tls=test_ca, cert="wrong")


@pytest.fixture
def mutual_tls_redis(tmp_path: Path, test_ca: Path) -> Iterator[RedisServer]:
    """As ``tls_redis``, wanting a client certificate of the test CA."""
    yield from _serve(tmp_path, tls=test_ca, auth_clients=True)


def _topology(made: Any, config: pytest.Config) -> Iterator[Any]:
    try:
        made.start(config)
        yield made
    finally:
        made.remove()


@pytest.fixture(scope="session")
def redis_cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    """A Redis Cluster of three primaries and three replicas, for the session's tests
    that do not break it (see :class:`~multilock.testing._servers.redis.Cluster`)."""
    yield from _topology(Cluster(tmp_path_factory.mktemp("cluster")), request.config)


@pytest.fixture(scope="session")
def redis_sentinels(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    """A primary, a replica and three Sentinels, for the session's tests that do not
    break them (see :class:`~multilock.testing._servers.redis.Sentinels`)."""
    yield from _topology(Sentinels(tmp_path_factory.mktemp("sentinel")), request.config)
