"""Fixtures of the PostgreSQL backend's tests, written as a third party would.

The server comes from ``MULTILOCK_POSTGRES_URL`` (default: the local test
database) through :func:`multilock.testing.server_url`, which skips when it is
down -- or fails when backends are required, as in CI.
"""

from __future__ import annotations

import os
import select
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlencode

import psycopg
import pytest

from multilock.backend import LockURL
from multilock.testing import server_url
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


class FreezableProxy:
    """A TCP proxy in front of the server that can freeze: stop forwarding while
    keeping every connection open, as a hung server, proxy or half-dead network
    does -- the case TCP itself never reports, since the proxy's kernel acks it all."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.05)
        self.port: int = self._listener.getsockname()[1]
        self.frozen = threading.Event()
        self._stopping = threading.Event()
        self._sockets: list[socket.socket] = []
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            upstream = socket.create_connection(self._target)
            self._sockets += [client, upstream]
            pump = threading.Thread(target=self._pump, args=(client, upstream), daemon=True)
            self._threads.append(pump)
            pump.start()

    def _pump(self, client: socket.socket, upstream: socket.socket) -> None:
        peer = {client: upstream, upstream: client}
        while not self._stopping.is_set():
            if self.frozen.is_set():
                time.sleep(0.01)
                continue
            try:
                readable, _, _ = select.select([client, upstream], [], [], 0.05)
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        raise ConnectionError("closed")
                    peer[sock].sendall(data)
            except (OSError, ConnectionError, ValueError):
                break
        for sock in (client, upstream):
            sock.close()

    def close(self) -> None:
        """Stop forwarding, close every connection, wait for the threads."""
        self._stopping.set()
        self._listener.close()
        for thread in self._threads:
            thread.join(timeout=5)


@pytest.fixture
def frozen_proxy(postgres_url: str) -> Iterator[FreezableProxy]:
    """A freezable TCP proxy in front of the test server (see :class:`FreezableProxy`)."""
    url = LockURL.parse(postgres_url)
    proxy = FreezableProxy(url.host or "127.0.0.1", url.port or 5432)
    yield proxy
    proxy.close()
