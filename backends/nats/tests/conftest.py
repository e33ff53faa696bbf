"""Fixtures of the NATS backend's tests, written as a third-party backend would.

``nats_url`` is the shared server (``MULTILOCK_NATS_URL``, default: a NATS server with
JetStream on 127.0.0.1:4222), skipped when it is down -- or failed when backends are
required. ``make_url`` gives each test a bucket of its own, deleted after the test, so
that the shared server keeps nothing of the run. Tests that break a server get a private
``nats-server`` on a free port (``private_nats``); the TLS tests' servers present
certificates of a throwaway CA made by the repository's ``scripts/test-ca`` (``test_ca``).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import nats
import pytest

from multilock.backend import LockURL
from multilock.testing import require_backends, server_url

DEFAULT_URL = "nats://127.0.0.1:4222/multilock-test"
SCRIPTS = Path(__file__).resolve().parents[3] / "scripts"


@pytest.fixture(scope="session")
def nats_url(request: pytest.FixtureRequest) -> str:
    """The lock URL of the test server, reachable or skipped."""
    return server_url(request.config, os.environ.get("MULTILOCK_NATS_URL", DEFAULT_URL))


def delete_buckets(server: str, buckets: list[str]) -> None:
    """Delete the KV buckets a test made (those that exist)."""

    async def main() -> None:
        nc = await nats.connect(server, allow_reconnect=False, connect_timeout=5)
        try:
            js = nc.jetstream(timeout=5)
            for bucket in buckets:
                try:
                    await js.delete_key_value(bucket)
                except nats.js.errors.NotFoundError:
                    pass
        finally:
            await nc.close()

    asyncio.run(main())


@pytest.fixture
def make_url(nats_url: str) -> Iterator[Callable[..., str]]:
    """``make_url(**options)``: the test server, a bucket of this test's own, options."""
    parsed = LockURL.parse(nats_url)
    host, port = parsed.host or "127.0.0.1", parsed.port or 4222
    base = parsed.path.strip("/") or "multilock-test"
    bucket = f"{base}-{uuid.uuid4().hex[:12]}"
    made: list[str] = []

    def make(**options: Any) -> str:
        made.append(bucket)
        query = f"?{urlencode(options)}" if options else ""
        return f"nats://{host}:{port}/{bucket}{query}"

    yield make
    if made:
        delete_buckets(f"nats://{host}:{port}", [bucket])


class PrivateNats:
    """A ``nats-server`` with JetStream of our own: ``start()``, ``stop()``, ``freeze()``."""

    def __init__(self, store: Path, *auth: str) -> None:
        """``auth``: more ``nats-server`` flags (credentials, TLS)."""
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port: int = probe.getsockname()[1]
        self.store = store
        self.auth = auth
        self.process: subprocess.Popen[bytes] | None = None

    def url(self, bucket: str = "faults", userinfo: str = "") -> str:
        """A lock URL of a bucket on this server, without options."""
        at = f"{userinfo}@" if userinfo else ""
        return f"nats://{at}127.0.0.1:{self.port}/{bucket}"

    def start(self) -> None:
        """Start it (on the same store as before) and wait until it takes connections."""
        executable = shutil.which("nats-server")
        if executable is None:
            raise RuntimeError("nats-server is not installed")
        self.process = subprocess.Popen(
            [executable, "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd", str(self.store),
             *self.auth],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 15
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise RuntimeError(f"nats-server on port {self.port} did not start") from None
                time.sleep(0.05)

    def stop(self) -> None:
        """Kill it (SIGKILL: a crash) and wait for it to exit."""
        if self.process is not None:
            self.process.send_signal(signal.SIGCONT)
            self.process.kill()
            self.process.wait(timeout=10)
            self.process = None

    def freeze(self) -> None:
        """Stop it where it stands (SIGSTOP): connections stay open, nothing answers.
        Returns once every thread of it is stopped (a thread running on another core
        at the signal could otherwise still answer one more request)."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)
        tasks = Path(f"/proc/{self.process.pid}/task")
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            states = [
                (task / "stat").read_text().rsplit(")", 1)[1].split()[0] for task in tasks.iterdir()
            ]
            if all(state in "Tt" for state in states):
                return
            time.sleep(0.005)

    def thaw(self) -> None:
        """Let a frozen server go on."""
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)


@pytest.fixture
def private_nats(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Callable[..., PrivateNats]]:
    """``private_nats(*auth_flags)``: a started private server, killed after the test."""
    servers: list[PrivateNats] = []

    def make(*auth: str) -> PrivateNats:
        server = PrivateNats(tmp_path / f"nats{len(servers)}", *auth)
        servers.append(server)
        try:
            server.start()
        except RuntimeError as exc:  # not installed, or did not start in time
            if require_backends(request.config):
                pytest.fail(str(exc), pytrace=False)
            pytest.skip(str(exc))
        return server

    yield make
    for server in servers:
        server.stop()


def tls_flags(ca: Path, cert: str = "server", client_auth: bool = False) -> tuple[str, ...]:
    """``nats-server`` flags for TLS with ``{cert}.crt`` of the test CA ``ca``, wanting a
    client certificate of that CA when ``client_auth``."""
    flags: tuple[str, ...] = ("--tls", "--tlscert", str(ca / f"{cert}.crt"))
    flags += ("--tlskey", str(ca / f"{cert}.key"))
    if client_auth:
        flags += ("--tlsverify", "--tlscacert", str(ca / "ca.crt"))
    return flags
