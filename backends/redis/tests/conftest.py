"""Fixtures of the Redis backend's tests, written as a third-party backend would.

``redis_url`` is the shared server (``MULTILOCK_REDIS_URL``), skipped when it is
down -- or failed when backends are required. ``throwaway_redis`` is a private
``redis-server`` on a free port that a test may stop, restart or kill clients of,
so that the shared server is never disturbed.
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

import pytest
import redis

from multilock.testing import server_url

DEFAULT_URL = "redis://127.0.0.1:6379/15"
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


class RedisServer:
    """A private ``redis-server`` process that a test may stop and start again."""

    def __init__(self, directory: Path, password: str | None = None, tls: bool = False) -> None:
        self.directory = directory
        self.password = password
        self.tls = tls
        self.certificate = directory / "cert.pem"
        # Unix socket paths are limited to about 100 bytes: keep it short.
        self.socket_path = Path(tempfile.mkdtemp(prefix="mlr-")) / "redis.sock"
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port: int = probe.getsockname()[1]
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """Its ``redis://`` URL."""
        return f"redis://127.0.0.1:{self.port}/0"

    def admin(self) -> redis.Redis:
        """A plain redis-py client for poking at the server from outside."""
        if self.tls:
            return redis.Redis(
                port=self.port, ssl=True, ssl_ca_certs=str(self.certificate), socket_timeout=5
            )
        return redis.Redis(port=self.port, password=self.password, socket_timeout=5)

    def _listen(self) -> list[str]:
        if not self.tls:
            return ["--port", str(self.port)]
        if not self.certificate.exists():
            _self_signed(self.certificate, self.directory / "key.pem")
        return [
            "--port",
            "0",
            "--tls-port",
            str(self.port),
            "--tls-cert-file",
            str(self.certificate),
            "--tls-key-file",
            str(self.directory / "key.pem"),
            "--tls-ca-cert-file",
            str(self.certificate),
            "--tls-auth-clients",
            "no",
        ]

    def start(self) -> None:
        """Start it and wait until it answers PING."""
        executable = shutil.which("redis-server")
        if executable is None:
            pytest.skip("redis-server is not installed")
        self.process = subprocess.Popen(
            [
                executable,
                *self._listen(),
                "--bind",
                "127.0.0.1",
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


def _self_signed(certificate: Path, key: Path) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is not installed: no certificate for the TLS server")
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=IP:127.0.0.1,DNS:localhost",
            "-keyout",
            str(key),
            "-out",
            str(certificate),
        ],
        check=True,
        capture_output=True,
    )


def _serve(
    directory: Path, password: str | None = None, tls: bool = False
) -> Iterator[RedisServer]:
    server = RedisServer(directory, password, tls)
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
def tls_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A private redis-server that speaks only TLS, with a self-signed certificate."""
    yield from _serve(tmp_path, tls=True)
