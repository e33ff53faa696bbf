"""Fixtures of the Redis backend's tests, written as a third-party backend would.

``redis_url`` is the shared server (``MULTILOCK_REDIS_URL``), skipped when it is
down -- or failed when backends are required. ``throwaway_redis`` is a private
``redis-server`` on a free port that a test may stop, restart or kill clients of,
so that the shared server is never disturbed. The TLS servers present certificates
of a throwaway CA made by the repository's ``scripts/test-ca`` (``test_ca``).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from multilock.testing import server_url

DEFAULT_URL = "redis://127.0.0.1:6379/15"
SCRIPTS = Path(__file__).resolve().parents[3] / "scripts"
_START_TIMEOUT = 10.0
SECRET = "s3cret-pa55"


@pytest.fixture(scope="session")
def redis_url(pytestconfig: pytest.Config) -> str:
    """The shared Redis server's URL for these tests."""
    return server_url(pytestconfig, os.environ.get("MULTILOCK_REDIS_URL", DEFAULT_URL))


@pytest.fixture
def name() -> str:
    """A lock name no other test uses."""
    return f"test-{uuid.uuid4().hex}"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on at ``host`` now (the kernel's pick)."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
    return port


class RedisServer:
    """A private ``redis-server`` process that a test may stop and start again.

    With ``tls`` (a :func:`test_ca` directory) it speaks only TLS, presenting
    ``{cert}.crt``, and with ``auth_clients`` it wants a client certificate.
    """

    def __init__(
        self,
        directory: Path,
        password: str | None = None,
        tls: Path | None = None,
        cert: str = "server",
        auth_clients: bool = False,
        args: tuple[str, ...] = (),
        host: str = "127.0.0.1",
        prefix: tuple[str, ...] = (),
    ) -> None:
        self.directory = directory
        self.password = password
        self.tls = tls
        self.cert = cert
        self.auth_clients = auth_clients
        self.args = args  # more redis-server options (cluster, replication...)
        self.host = host  # the address it listens on
        self.prefix = prefix  # what runs it: ("ip", "netns", "exec", name) in a namespace
        # Unix socket paths are limited to about 100 bytes: keep it short.
        self.socket_path = Path(tempfile.mkdtemp(prefix="mlr-")) / "redis.sock"
        # In a namespace of its own every port is free: pick one free on the host's
        # loopback, so that no two servers of a test share a port.
        self.port: int = free_port("127.0.0.1" if prefix else host)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """Its ``redis://`` URL."""
        return f"redis://{self.host}:{self.port}/0"

    def admin(self) -> redis.Redis:
        """A plain redis-py client for poking at the server from outside."""
        if self.tls:
            # Trusts the test CA, whatever name the server's certificate has.
            return redis.Redis(
                port=self.port,
                ssl=True,
                ssl_ca_certs=str(self.tls / "ca.crt"),
                ssl_check_hostname=False,
                ssl_certfile=str(self.tls / "client.crt"),
                ssl_keyfile=str(self.tls / "client.key"),
                socket_timeout=5,
            )
        return redis.Redis(self.host, self.port, password=self.password, socket_timeout=5)

    def _listen(self) -> list[str]:
        if not self.tls:
            return ["--port", str(self.port)]
        return [
            *("--port", "0", "--tls-port", str(self.port)),
            *("--tls-cert-file", str(self.tls / f"{self.cert}.crt")),
            *("--tls-key-file", str(self.tls / f"{self.cert}.key")),
            *("--tls-ca-cert-file", str(self.tls / "ca.crt")),
            *("--tls-auth-clients", "yes" if self.auth_clients else "no"),
        ]

    def start(self) -> None:
        """Start it and wait until it answers PING."""
        executable = shutil.which("redis-server")
        if executable is None:
            pytest.skip("redis-server is not installed")
        self.process = subprocess.Popen(
            [
                *self.prefix,
                executable,
                *self._listen(),
                "--bind",
                self.host,
                # Off the loopback, only on a test's own veth link: let its peers in.
                "--protected-mode",
                "yes" if self.host == "127.0.0.1" else "no",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.directory),
                "--unixsocket",
                str(self.socket_path),
                "--unixsocketperm",
                "700",
                *(["--requirepass", self.password] if self.password else []),
                *self.args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + _START_TIMEOUT
        while True:
            try:
                with self.admin() as client:
                    client.ping()
                return
            except redis.ConnectionError:
                if self.tls and self.process.poll() is not None:
                    pytest.skip("this redis-server cannot serve TLS")
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise RuntimeError(f"redis-server on port {self.port} did not start") from None
                time.sleep(0.02)

    def pause(self) -> None:
        """Freeze it (SIGSTOP): connections stay open, nothing answers."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """Thaw it (SIGCONT)."""
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        """Kill it (SIGKILL: a crash, not a shutdown) and wait for it to exit."""
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=10)
            self.process = None

    def remove(self) -> None:
        """Stop it and delete its socket directory."""
        self.stop()
        shutil.rmtree(self.socket_path.parent, ignore_errors=True)


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
    that do not break it (see ``topology.Cluster``)."""
    from .topology import Cluster

    yield from _topology(Cluster(tmp_path_factory.mktemp("cluster")), request.config)


@pytest.fixture(scope="session")
def redis_sentinels(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    """A primary, a replica and three Sentinels, for the session's tests that do not
    break them (see ``topology.Sentinels``)."""
    from .topology import Sentinels

    yield from _topology(Sentinels(tmp_path_factory.mktemp("sentinel")), request.config)
