"""Fixtures of the MySQL backend's tests, written as a third party would.

The server comes from ``MULTILOCK_MYSQL_URL`` (default: the local ``test``
database) through :func:`multilock.testing.server_url`, which skips when it is
down -- or fails when backends are required, as in CI. Tests that stop, freeze or
reconfigure a server get a private MariaDB of their own (:class:`PrivateServer`); the
TLS tests' servers present certificates of a throwaway CA made by the repository's
``scripts/test-ca`` (``test_ca``).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pymysql
import pytest

from multilock.backend import LockURL
from multilock.testing import poll, require_backends, server_url
from multilock_mysql._config import parse_settings
from multilock_mysql._runtime import connect as connect_settings

DEFAULT_URL = "mysql://root@127.0.0.1:3306/test"
SCRIPTS = Path(__file__).resolve().parents[3] / "scripts"
SERVER = shutil.which("mariadbd") or shutil.which("mysqld")
INSTALL_DB = shutil.which("mariadb-install-db") or shutil.which("mysql_install_db")


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


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class PrivateServer:
    """A throwaway MariaDB (or MySQL) server on a free port, for tests that stop, freeze
    or reconfigure their server. ``url`` reaches it as root without a password."""

    def __init__(self, root: Path, *extra: str) -> None:
        assert SERVER is not None
        assert INSTALL_DB is not None
        self.root = root
        self.port = _free_port()
        self.extra = extra
        self.url = f"mysql://root@127.0.0.1:{self.port}/test"
        self.proc: subprocess.Popen[bytes] | None = None
        data = root / "data"
        subprocess.run(
            [
                INSTALL_DB,
                "--no-defaults",
                f"--datadir={data}",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
                *(["--user=root"] if os.geteuid() == 0 else []),
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
        self.start()
        conn = pymysql.connect(host="127.0.0.1", port=self.port, user="root")
        with conn.cursor() as cursor:
            cursor.execute("CREATE DATABASE IF NOT EXISTS test")
        conn.close()

    def start(self) -> None:
        """Start the server and wait until it answers (30 s at most)."""
        root = self.root
        argv = [
            str(SERVER),
            "--no-defaults",
            f"--datadir={root / 'data'}",
            f"--port={self.port}",
            "--bind-address=127.0.0.1",
            f"--socket={root / 'sock'}",
            f"--pid-file={root / 'pid'}",
            f"--log-error={root / 'error.log'}",
            "--skip-log-bin",
            "--innodb-buffer-pool-size=16M",
            *(["--user=root"] if os.geteuid() == 0 else []),
            *self.extra,
        ]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        poll(f"the private server on port {self.port} answering", self.answers, within=30)

    def answers(self) -> bool:
        """Whether the server takes a connection."""
        try:
            conn = pymysql.connect(host="127.0.0.1", port=self.port, user="root", connect_timeout=1)
            conn.close()
        except pymysql.err.MySQLError:
            return False
        return True

    def stop(self) -> None:
        """Shut the server down (SIGTERM: a clean shutdown) and wait for it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def freeze(self) -> None:
        """SIGSTOP: the kernel still accepts bytes for it, nothing answers. Returns once
        every thread of it is stopped (a thread running on another core at the signal
        could otherwise still answer one more round trip)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)
        tasks = Path(f"/proc/{self.proc.pid}/task")
        poll(
            "every thread of the server stopped",
            lambda: all(
                (task / "stat").read_text().rsplit(")", 1)[1].split()[0] in "Tt"
                for task in tasks.iterdir()
            ),
            within=5,
            not_yet=(OSError,),  # a thread that ended as we looked
        )

    def thaw(self) -> None:
        """SIGCONT."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)


def private_server(request: pytest.FixtureRequest, root: Path, *extra: str) -> PrivateServer:
    """A :class:`PrivateServer`, or a skip (a failure when backends are required)
    where no server binary is installed."""
    if SERVER is None or INSTALL_DB is None:
        message = "no mariadbd/mysqld and mariadb-install-db to run a private server"
        if require_backends(request.config):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    server = PrivateServer(root, *extra)
    request.addfinalizer(server.stop)
    return server


@pytest.fixture(scope="module")
def private(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> PrivateServer:
    """A private server for this test module (see :class:`PrivateServer`)."""
    return private_server(request, tmp_path_factory.mktemp("mariadb"))
