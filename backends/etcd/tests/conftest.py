"""Fixtures of the etcd backend's tests, written as a third-party backend would.

``etcd_url`` is the shared test server (``MULTILOCK_ETCD_URL``, default: the one
``scripts/etcd.sh start`` runs on 127.0.0.1:2379), skipped when it is down -- or failed
when backends are required. Every test gets a key prefix of its own (``make_url``).
Tests that break a server get a private one (``private_etcd``), run by the repository's
``scripts/etcd.sh`` on free ports; they skip where that script is not (an installed sdist).
The TLS tests run ``etcd`` themselves (``tls_etcd``), with certificates of a throwaway
CA made by the repository's ``scripts/test-ca`` (``test_ca``).
The servers themselves are the repository's test support,
:mod:`multilock.testing._servers.etcd`: these are only their fixtures.
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

from multilock.backend import LockURL
from multilock.testing import server_url
from multilock.testing._servers import unavailable
from multilock.testing._servers.etcd import PrivateEtcd, TLSEtcd
from multilock.testing._servers.process import script

DEFAULT_URL = "etcd://127.0.0.1:2379/multilock-test"


@pytest.fixture(scope="session")
def etcd_url(request: pytest.FixtureRequest) -> str:
    """The lock URL of the test server, reachable or skipped."""
    return server_url(request.config, os.environ.get("MULTILOCK_ETCD_URL", DEFAULT_URL))


@pytest.fixture
def make_url(etcd_url: str) -> Callable[..., str]:
    """``make_url(**options)``: the test server, a prefix of this test's own, options."""
    parsed = LockURL.parse(etcd_url)
    hosts = ",".join(f"{host}:{port or 2379}" for host, port in parsed.hosts)
    prefix = f"{parsed.path.strip('/') or 'multilock-test'}/t-{uuid.uuid4().hex[:12]}"

    def make(**options: Any) -> str:
        query = f"?{urlencode(options)}" if options else ""
        return f"etcd://{hosts}/{prefix}{query}"

    return make


@pytest.fixture
def private_etcd(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Callable[..., PrivateEtcd]]:
    """``private_etcd(keep_data=False, args="")``: a started server (see
    :class:`PrivateEtcd`), stopped after the test."""
    etcd_sh = script(request.config, "etcd.sh")
    servers: list[PrivateEtcd] = []

    def make(**options: Any) -> PrivateEtcd:
        server = PrivateEtcd(etcd_sh, tmp_path / f"etcd{len(servers)}", **options)
        servers.append(server)
        try:
            server.start()
        except subprocess.CalledProcessError as exc:
            unavailable(
                request.config, f"cannot start a private etcd: {exc.stderr.decode()[-500:]}"
            )
        return server

    yield make
    for server in servers:
        server.stop()


@pytest.fixture(scope="module")
def tls_etcd(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, test_ca: Path
) -> Iterator[Callable[..., TLSEtcd]]:
    """``tls_etcd(cert="server", client_auth=False)``: a started :class:`TLSEtcd`, one per
    set of arguments in the module, killed after it; skipped (failed when backends are
    required) where etcd cannot run."""
    servers: dict[tuple[str, bool], TLSEtcd] = {}

    def make(cert: str = "server", client_auth: bool = False) -> TLSEtcd:
        if (cert, client_auth) not in servers:
            server = TLSEtcd(tmp_path_factory.mktemp("etcd-tls"), test_ca, cert, client_auth)
            try:
                server.start()
            except RuntimeError as exc:
                unavailable(request.config, f"cannot start a TLS etcd: {exc}")
            servers[cert, client_auth] = server
        return servers[cert, client_auth]

    yield make
    for server in servers.values():
        server.stop()
