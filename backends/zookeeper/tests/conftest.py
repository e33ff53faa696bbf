"""Fixtures of the ZooKeeper backend's tests, written as a third party would.

The server comes from ``MULTILOCK_ZOOKEEPER_URL`` (default: the local test
server that ``scripts/zookeeper.sh start`` runs) through
:func:`multilock.testing.server_url`, which skips when it is down -- or fails
when backends are required, as in CI. Every test gets a chroot of its own.

Tests that break a server or need TLS get a private one (``private_zookeeper``),
run by the repository's ``scripts/zookeeper.sh``, with certificates from its
``scripts/test-ca``; they skip where those scripts are not (an installed sdist).
The topology tests get a 3-node ensemble of such servers (``zookeeper_ensemble``).
The servers themselves are the repository's test support,
:mod:`multilock.testing._servers.zookeeper`: these are only their fixtures.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from kazoo.client import KazooClient

from multilock.backend import LockURL
from multilock.testing import server_url
from multilock.testing._servers import unavailable
from multilock.testing._servers.process import script
from multilock.testing._servers.zookeeper import PrivateZooKeeper, ZooKeeperEnsemble
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
def kazoo_client(zookeeper_url: str) -> Iterator[Callable[..., KazooClient]]:
    """``kazoo_client(**kwargs)``: a started plain kazoo client of the test server (as
    another application would have one), stopped after the test."""
    config = Config.from_url(LockURL.parse(zookeeper_url))
    clients: list[KazooClient] = []

    def make(**kwargs: Any) -> KazooClient:
        clients.append(KazooClient(**config.connection_options(), **kwargs))
        clients[-1].start(timeout=config.connect_timeout)
        return clients[-1]

    yield make
    for client in clients:
        client.stop()
        client.close()


@pytest.fixture
def admin(kazoo_client: Callable[..., KazooClient]) -> KazooClient:
    """A plain kazoo client without credentials, as another application would have."""
    return kazoo_client()


@pytest.fixture(scope="module")
def zookeeper_ensemble(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ZooKeeperEnsemble]:
    """A started 3-node :class:`ZooKeeperEnsemble` of the test module, stopped after it."""
    ensemble = ZooKeeperEnsemble(
        script(request.config, "zookeeper.sh"), tmp_path_factory.mktemp("ensemble")
    )
    try:
        try:
            ensemble.start()
        except (subprocess.CalledProcessError, AssertionError) as exc:
            detail = (
                exc.stderr.decode()[-500:]
                if isinstance(exc, subprocess.CalledProcessError)
                else exc
            )
            unavailable(request.config, f"cannot start a ZooKeeper ensemble: {detail}")
        yield ensemble
    finally:
        ensemble.stop()


@pytest.fixture
def private_zookeeper(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Callable[..., PrivateZooKeeper]]:
    """``private_zookeeper(keep_data=False, tls=None, ...)``: a started server (see
    :class:`PrivateZooKeeper`), stopped after the test.

    Restart with ``keep_data=True``: a server that comes back *without* its data
    refuses clients that have seen a later zxid (ZooKeeper's own rule against
    going back in time), so such a restart is a new ensemble, not a fault.
    """
    zookeeper_sh = script(request.config, "zookeeper.sh")
    servers: list[PrivateZooKeeper] = []

    def make(**options: Any) -> PrivateZooKeeper:
        server = PrivateZooKeeper(zookeeper_sh, tmp_path / f"zk{len(servers)}", **options)
        servers.append(server)
        try:
            server.start()
        except subprocess.CalledProcessError as exc:
            unavailable(
                request.config, f"cannot start a private ZooKeeper: {exc.stderr.decode()[-500:]}"
            )
        return server

    yield make
    for server in servers:
        server.stop()
