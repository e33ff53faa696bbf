"""A restart of the server: leases fire ``lost``, calls fail promptly while it is
down, and the locker reconnects by itself once it is back. Runs on a private
throwaway server, so that the shared one is never restarted."""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import multilock
from multilock.errors import BackendUnavailable

pytestmark = pytest.mark.faults

INTERVAL = 0.5


def _bindir() -> Path | None:
    pg_config = shutil.which("pg_config")
    if pg_config:
        found = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True)
        if found.returncode == 0 and (Path(found.stdout.strip()) / "initdb").exists():
            return Path(found.stdout.strip())
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    return versions[-1].parent if versions else None


class PrivateServer:
    """A PostgreSQL cluster in a temporary directory, on a free port, that a test may
    stop and start. As root it runs as the ``postgres`` user (the server refuses root)."""

    def __init__(self, bindir: Path) -> None:
        self._bindir = bindir
        self._user: str | None = None
        if os.geteuid() == 0:
            try:
                pwd.getpwnam("postgres")
            except KeyError:
                pytest.skip("running as root and there is no postgres user to run a server as")
            self._user = "postgres"
        self.directory = Path(tempfile.mkdtemp(prefix="multilock-pg-"))
        if self._user:
            shutil.chown(self.directory, self._user)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self._process: subprocess.Popen[bytes] | None = None
        subprocess.run(
            [
                *(str(bindir / "initdb"), "-D", str(self.directory / "data")),
                *("-A", "trust", "-U", "postgres", "--no-sync", "--no-instructions"),
            ],
            check=True,
            capture_output=True,
            user=self._user,
        )

    @property
    def url(self) -> str:
        """A lock URL of this server's ``postgres`` database."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        """Start the server and wait (at most 30 s) until it accepts connections."""
        self._process = subprocess.Popen(
            [
                *(str(self._bindir / "postgres"), "-D", str(self.directory / "data")),
                *("-p", str(self.port), "-k", str(self.directory), "-c", "fsync=off"),
                *("-c", "listen_addresses=127.0.0.1"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            user=self._user,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres").close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline or self._process.poll() is not None:
                    raise
                time.sleep(0.05)

    def stop(self) -> None:
        """Fast shutdown: the server ends every session, then exits."""
        if self._process is not None:
            self._process.send_signal(signal.SIGINT)
            self._process.wait(timeout=30)
            self._process = None

    def remove(self) -> None:
        """Stop and delete the cluster."""
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)


@pytest.fixture(scope="module")
def private_server() -> Iterator[PrivateServer]:
    """A private server, started; it is started again after each test if need be."""
    bindir = _bindir()
    if bindir is None:
        pytest.skip("the PostgreSQL server binaries (initdb) are not installed")
    server = PrivateServer(bindir)
    try:
        server.start()
        yield server
    finally:
        server.remove()


def _name() -> str:
    return f"restart-{uuid.uuid4().hex}"


def test_restart_fires_lost_and_the_locker_reconnects(private_server: PrivateServer) -> None:
    with multilock.connect(f"{private_server.url}?health_interval={INTERVAL}") as locker:
        lease = locker.try_acquire(_name())
        assert lease is not None
        try:
            private_server.stop()
            stopped = time.monotonic()
            assert lease.lost.wait(INTERVAL + 1.0)
            assert time.monotonic() - stopped <= INTERVAL + 1.0
            started = time.monotonic()
            with pytest.raises(BackendUnavailable):
                locker.try_acquire(_name())  # down: an error, never None
            assert time.monotonic() - started < 3.0
        finally:
            private_server.start()
        again = locker.try_acquire(lease.name)  # back: a new session, transparently
        assert again is not None
        again.release()


def test_async_restart_fires_lost_and_the_locker_reconnects(
    private_server: PrivateServer,
) -> None:
    async def main() -> None:
        url = f"{private_server.url}?health_interval={INTERVAL}"
        async with multilock.connect_async(url) as locker:
            lease = await locker.try_acquire(_name())
            assert lease is not None
            try:
                private_server.stop()

                async def lost() -> str:
                    return await lease.lost

                await asyncio.wait_for(lost(), INTERVAL + 1.0)
                with pytest.raises(BackendUnavailable):
                    await locker.try_acquire(_name())
            finally:
                private_server.start()
            again = await locker.try_acquire(lease.name)
            assert again is not None
            await again.release()

    asyncio.run(main())


def test_a_shutdown_fires_lost_within_100_ms(private_server: PrivateServer) -> None:
    # Issue 16: the server ending every session is seen on each idle session's socket at
    # once (health_interval is an hour: the check cannot be what noticed).
    with (
        multilock.connect(f"{private_server.url}?health_interval=1h") as locker,
        multilock.connect(f"{private_server.url}?health_interval=1h") as other,
    ):
        leases = [locker.try_acquire(_name()), other.try_acquire(_name())]
        fired: list[float] = []
        for lease in leases:
            assert lease is not None
            lease.lost.add_callback(lambda _reason: fired.append(time.monotonic()))
        try:
            stopping = time.monotonic()
            private_server.stop()  # SIGINT, then waits for the server to exit
            for lease in leases:
                assert lease is not None
                assert lease.lost.wait(5.0)
            assert max(fired) - stopping <= 0.1, max(fired) - stopping
        finally:
            private_server.start()
