"""A private MariaDB (or MySQL) server on a free port, for tests that stop, freeze or
reconfigure their server (:class:`PrivateServer`)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pymysql
import pytest

from .._poll import poll
from . import unavailable
from .process import ChildServer, free_port

__all__ = ["INSTALL_DB", "SERVER", "PrivateServer", "private_server"]

SERVER = shutil.which("mariadbd") or shutil.which("mysqld")
"""The server program, if installed."""
INSTALL_DB = shutil.which("mariadb-install-db") or shutil.which("mysql_install_db")
"""The program that makes a data directory, if installed."""


class PrivateServer(ChildServer):
    """A throwaway MariaDB (or MySQL) server on a free port, for tests that stop, freeze
    or reconfigure their server. ``url`` reaches it as root without a password."""

    def __init__(self, root: Path, *extra: str) -> None:
        assert SERVER is not None
        assert INSTALL_DB is not None
        self.root = root
        self.port = free_port()
        self.extra = extra
        self.url = f"mysql://root@127.0.0.1:{self.port}/test"
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
        self.process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def private_server(request: pytest.FixtureRequest, root: Path, *extra: str) -> PrivateServer:
    """A :class:`PrivateServer`, or a skip (a failure when backends are required)
    where no server binary is installed."""
    if SERVER is None or INSTALL_DB is None:
        unavailable(
            request.config, "no mariadbd/mysqld and mariadb-install-db to run a private server"
        )
    server = PrivateServer(root, *extra)
    request.addfinalizer(server.stop)
    return server
