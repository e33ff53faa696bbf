"""Fixtures of the ZooKeeper backend's tests, written as a third party would.

The server comes from ``MULTILOCK_ZOOKEEPER_URL`` (default: the local test
server that ``scripts/zookeeper.sh start`` runs) through
:func:`multilock.testing.server_url`, which skips when it is down -- or fails
when backends are required, as in CI. Every test gets a chroot of its own.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlencode

import pytest
from kazoo.client import KazooClient

from multilock.backend import LockURL
from multilock.testing import server_url
from multilock_zookeeper._config import Config

DEFAULT_URL = "zookeeper://127.0.0.1:2181/multilock-test"


@pytest.fixture(scope="session")
def zookeeper_url(request: pytest.FixtureRequest) -> str:
    """The lock URL of the test server, reachable or skipped."""
    return server_url(request.config, os.environ.get("MULTILOCK_ZOOKEEPER_URL", DEFAULT_URL))


@pytest.fixture
def chroot(zookeeper_url: str) -> str:
    """A chroot unique to the test, under the test URL's."""
    base = LockURL.parse(zookeeper_url).path.rstrip("/") or "/multilock-test"
    return f"{base}/t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def make_url(zookeeper_url: str, chroot: str) -> Callable[..., str]:
    """``make_url(userinfo="", **options)``: the test server, the test's chroot, options."""
    parsed = LockURL.parse(zookeeper_url)
    hosts = ",".join(f"{host}:{port or 2181}" for host, port in parsed.hosts)

    def make(userinfo: str = "", **options: Any) -> str:
        query = f"?{urlencode(options)}" if options else ""
        at = f"{userinfo}@" if userinfo else ""
        return f"{parsed.scheme}://{at}{hosts}{chroot}{query}"

    return make


@pytest.fixture
def admin(zookeeper_url: str) -> Iterator[KazooClient]:
    """A plain kazoo client without credentials, as another application would have."""
    config = Config.from_url(LockURL.parse(zookeeper_url))
    client = KazooClient(hosts=config.hosts, timeout=config.session_timeout)
    client.start(timeout=config.connect_timeout)
    try:
        yield client
    finally:
        client.stop()
        client.close()
