"""Fixtures of the MySQL backend's tests, written as a third party would.

The server comes from ``MULTILOCK_MYSQL_URL`` (default: the local ``test``
database) through :func:`multilock.testing.server_url`, which skips when it is
down -- or fails when backends are required, as in CI. Tests that stop, freeze or
reconfigure a server get a private MariaDB of their own (:class:`PrivateServer`); the
TLS tests' servers present certificates of a throwaway CA made by the repository's
``scripts/test-ca`` (``test_ca``).
The servers themselves are the repository's test support,
:mod:`multilock.testing._servers.mysql`: these are only their fixtures.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlencode

import pymysql
import pytest

from multilock.backend import LockURL
from multilock.testing import server_url
from multilock.testing._servers.mysql import PrivateServer, private_server
from multilock_mysql._config import parse_settings
from multilock_mysql._runtime import connect as connect_settings

DEFAULT_URL = "mysql://root@127.0.0.1:3306/test"


@pytest.fixture(scope="session")
def mysql_url(request: pytest.FixtureRequest) -> str:
    """The MySQL lock URL of the test server, reachable or skipped."""
    return server_url(request.config, os.environ.get("MULTILOCK_MYSQL_URL", DEFAULT_URL))


@pytest.fixture
def program_name() -> str:
    """A program_name unique to the test, to tell its sessions apart."""
    return f"mlmy-test-{uuid.uuid4().hex[:12]}"


def with_options(url: str, **options: Any) -> str:
    """``url`` with ``options`` added to its query."""
    query = urlencode({k: str(v).lower() if isinstance(v, bool) else v for k, v in options.items()})
    return f"{url}{'&' if '?' in url else '?'}{query}" if query else url


@pytest.fixture
def make_url(mysql_url: str, program_name: str) -> Callable[..., str]:
    """``make_url(**options)``: the test URL with the test's program_name and options."""

    def make(**options: Any) -> str:
        return with_options(mysql_url, program_name=program_name, **options)

    return make


def connect(url: str) -> pymysql.Connection[Any]:
    """A plain PyMySQL session to ``url``'s server, as another replica would have."""
    return connect_settings(parse_settings(LockURL.parse(url)))


@pytest.fixture
def admin(mysql_url: str) -> Iterator[pymysql.Connection[Any]]:
    """A plain PyMySQL session on the test database."""
    conn = connect(mysql_url)
    yield conn
    conn.close()


def query(conn: pymysql.Connection[Any], sql: str, *args: Any) -> list[tuple[Any, ...]]:
    """The rows of ``sql`` on ``conn``."""
    with conn.cursor() as cursor:
        cursor.execute(sql, args or None)
        return list(cursor.fetchall())


@pytest.fixture
def holder(admin: pymysql.Connection[Any]) -> Callable[[str], int | None]:
    """``holder(key)``: the connection id holding user-level lock ``key``, or ``None``."""

    def find(key: str) -> int | None:
        ((connection,),) = query(admin, "SELECT IS_USED_LOCK(%s)", key)
        return None if connection is None else int(connection)

    return find


@pytest.fixture(scope="module")
def private(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> PrivateServer:
    """A private server for this test module (see :class:`PrivateServer`)."""
    return private_server(request, tmp_path_factory.mktemp("mariadb"))
