"""Fixtures of the PostgreSQL backend's tests, written as a third party would.

The server comes from ``MULTILOCK_POSTGRES_URL`` (default: the local test
database) through :func:`multilock.testing.server_url`, which skips when it is
down -- or fails when backends are required, as in CI. Tests that restart a
server or need TLS get a private cluster (``private_server``), with certificates
of a throwaway CA made by the repository's ``scripts/test-ca`` (``test_ca``).
The topology tests put Debian's PgBouncer in front of a server (``pgbouncer``).
The servers themselves are the repository's test support,
:mod:`multilock.testing._servers.postgres`: these are only their fixtures.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlencode

import psycopg
import pytest

from multilock.backend import LockURL
from multilock.testing import TcpProxy, server_url
from multilock.testing._servers import unavailable
from multilock.testing._servers.postgres import PgBouncer, PrivateServer, ReplicatedPair, programs
from multilock.testing._servers.postgres import private_server as start_private_server
from multilock_postgres._config import parse_settings

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/test"


@pytest.fixture(scope="session")
def postgres_url(request: pytest.FixtureRequest) -> str:
    """The PostgreSQL lock URL of the test server, reachable or skipped."""
    return server_url(request.config, os.environ.get("MULTILOCK_POSTGRES_URL", DEFAULT_URL))


@pytest.fixture
def app_name() -> str:
    """An application_name unique to the test, to find its sessions in pg_stat_activity."""
    return f"mlpg-test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def make_url(postgres_url: str, app_name: str) -> Callable[..., str]:
    """``make_url(**options)``: the test URL with the test's application_name and options."""

    def make(**options: Any) -> str:
        merged = {"application_name": app_name, **options}
        query = urlencode(
            {k: str(v).lower() if isinstance(v, bool) else v for k, v in merged.items()}
        )
        return f"{postgres_url}{'&' if '?' in postgres_url else '?'}{query}"

    return make


@pytest.fixture
def admin(postgres_url: str) -> Iterator[psycopg.Connection[Any]]:
    """A plain psycopg session on the test database, as another replica would have."""
    settings = parse_settings(LockURL.parse(postgres_url))
    with psycopg.Connection.connect(settings.conninfo, **settings.connect_kwargs()) as conn:
        yield conn


@pytest.fixture
def sessions(admin: psycopg.Connection[Any]) -> Callable[[str], int]:
    """``sessions(app_name)``: how many server sessions carry that application_name."""

    def count(app_name: str) -> int:
        row = admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (app_name,)
        ).fetchone()
        assert row is not None
        return int(row[0])

    return count


@pytest.fixture
def holders(admin: psycopg.Connection[Any]) -> Callable[[int], list[int]]:
    """``holders(key)``: pids of the sessions holding bigint advisory ``key`` here."""

    def find(key: int) -> list[int]:
        unsigned = key & 0xFFFFFFFFFFFFFFFF
        rows = admin.execute(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1"
            " AND classid::bigint = %s AND objid::bigint = %s"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            (unsigned >> 32, unsigned & 0xFFFFFFFF),
        ).fetchall()
        return [int(pid) for (pid,) in rows]

    return find


@pytest.fixture
def sequence(admin: psycopg.Connection[Any]) -> Iterator[str]:
    """A fencing sequence of this test alone (created by postgres, the test's role)."""
    name = f"mlpg_fence_{uuid.uuid4().hex[:12]}"
    admin.execute(f"CREATE SEQUENCE {name} AS bigint CACHE 1")
    yield name
    admin.execute(f"DROP SEQUENCE IF EXISTS {name}")


@pytest.fixture
def other_role(admin: psycopg.Connection[Any]) -> Iterator[str]:
    """A second login role (no CREATE on public), dropped with what it owns afterwards."""
    role = f"mlpg_role_{uuid.uuid4().hex[:10]}"
    admin.execute(f"CREATE ROLE {role} LOGIN")
    admin.execute(f"REVOKE CREATE ON SCHEMA public FROM {role}")
    yield role
    admin.execute(f"DROP OWNED BY {role} CASCADE")
    admin.execute(f"DROP ROLE {role}")


@pytest.fixture
def peer_locks(postgres_url: str) -> Iterator[Callable[[str], None]]:
    """``peer_locks(sequence)``: a peer session takes a lock on the sequence that
    ``nextval`` must wait for, and keeps it until the test ends."""
    settings = parse_settings(LockURL.parse(postgres_url))
    with psycopg.Connection.connect(settings.conninfo, password=settings.password) as peer:

        def lock(sequence: str) -> None:
            peer.execute(f"ALTER SEQUENCE {sequence} CACHE 1")  # in a transaction left open

        yield lock
        peer.rollback()


@pytest.fixture
def frozen_proxy(postgres_url: str) -> Iterator[TcpProxy]:
    """A TCP proxy in front of the test server, to freeze (see :meth:`TcpProxy.freeze`)."""
    url = LockURL.parse(postgres_url)
    with TcpProxy((url.host or "127.0.0.1", url.port or 5432)) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def replicated_pair(request: pytest.FixtureRequest) -> Iterator[Callable[..., ReplicatedPair]]:
    """``replicated_pair(synchronous=True)``: a started :class:`ReplicatedPair`; every
    pair the module made is removed after it. Without the server's programs: a skip, or
    a failure when backends are required (CI)."""
    found = programs(request.config, "pg_basebackup")
    pairs: list[ReplicatedPair] = []

    def make(*, synchronous: bool = True) -> ReplicatedPair:
        pairs.append(ReplicatedPair(found, synchronous=synchronous))
        return pairs[-1]

    try:
        yield make
    finally:
        for pair in pairs:
            pair.remove()


@pytest.fixture(scope="module")
def pgbouncer(request: pytest.FixtureRequest, postgres_url: str) -> Iterator[Callable[..., str]]:
    """``pgbouncer(databases=None, **settings)``: a started :class:`PgBouncer` in front of
    the test server; the test database's lock URL through it. Stopped after the module."""
    if shutil.which("pgbouncer") is None:
        unavailable(
            request.config,
            "pgbouncer is not installed (Debian's pgbouncer; scripts/test installs it)",
        )
    url = LockURL.parse(postgres_url)
    started: list[PgBouncer] = []

    def start(databases: dict[str, str] | None = None, **settings: str | int) -> str:
        host, port = url.host or "127.0.0.1", url.port or 5432
        started.append(PgBouncer(host, port, databases, **settings))
        return started[-1].url(url.path.lstrip("/") or "postgres")

    try:
        yield start
    finally:
        for bouncer in started:
            bouncer.stop()


@pytest.fixture(scope="module")
def private_server(request: pytest.FixtureRequest) -> Iterator[PrivateServer]:
    """A private server of the test module, started; a test that stops it starts it again."""
    server = start_private_server(request.config)
    try:
        yield server
    finally:
        server.remove()
