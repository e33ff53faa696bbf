"""Fixtures of the etcd backend's tests, written as a third-party backend would.

``etcd_url`` is the shared test server (``MULTILOCK_ETCD_URL``, default: the one
``scripts/etcd.sh start`` runs on 127.0.0.1:2379), skipped when it is down -- or failed
when backends are required. Every test gets a key prefix of its own (``make_url``).
Tests that break a server get a private one (``private_etcd``), run by the repository's
``scripts/etcd.sh`` on free ports; they skip where that script is not (an installed sdist).
The TLS tests run ``etcd`` themselves (``tls_etcd``), with certificates of a throwaway
CA made by the repository's ``scripts/test-ca`` (``test_ca``).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

from multilock.backend import LockURL
from multilock.testing import require_backends, server_url

DEFAULT_URL = "etcd://127.0.0.1:2379/multilock-test"
SCRIPTS = Path(__file__).resolve().parents[3] / "scripts"


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


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


class PrivateEtcd:
    """One single-member etcd of our own: ``start()``, ``stop()``, ``kill()``, ``freeze()``."""

    def __init__(self, state: Path, *, keep_data: bool = False, args: str = "") -> None:
        self.port = _free_port()
        self.env = {
            **os.environ,
            "MULTILOCK_ETCD_PORT": str(self.port),
            "MULTILOCK_ETCD_PEER_PORT": str(_free_port()),
            "MULTILOCK_ETCD_DIR": str(state),
            "MULTILOCK_ETCD_KEEP_DATA": "1" if keep_data else "0",
            "MULTILOCK_ETCD_ARGS": args,
        }

    @property
    def url(self) -> str:
        """The lock URL of a prefix of this server, without options."""
        return f"etcd://127.0.0.1:{self.port}/faults"

    @property
    def endpoint(self) -> str:
        """Its client URL, for etcdctl."""
        return f"http://127.0.0.1:{self.port}"

    def _run(self, command: str) -> None:
        subprocess.run(
            ["bash", str(SCRIPTS / "etcd.sh"), command],
            env=self.env,
            check=True,
            capture_output=True,
        )

    def start(self) -> None:
        """Start the server; return once it answers."""
        self._run("start")

    def stop(self) -> None:
        """Stop the server (gracefully)."""
        self._run("stop")

    def kill(self) -> None:
        """SIGKILL the server: its connections are reset, as when its host crashes."""
        os.kill(self._pid(), signal.SIGKILL)

    def freeze(self) -> None:
        """Stop the server's process where it stands: a blackhole that keeps connections.
        Returns once every thread of it is stopped (a thread running on another core at
        the signal could otherwise still answer one more request)."""
        pid = self._pid()
        os.kill(pid, signal.SIGSTOP)
        tasks = Path(f"/proc/{pid}/task")
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            stats = [(task / "stat").read_text() for task in tasks.iterdir()]
            if all(stat.rsplit(")", 1)[1].split()[0] in "Tt" for stat in stats):
                return
            time.sleep(0.005)

    def thaw(self) -> None:
        """Let a frozen server go on."""
        try:
            os.kill(self._pid(), signal.SIGCONT)
        except (ProcessLookupError, FileNotFoundError):
            pass

    def etcdctl(self, *args: str, stdin: str | None = None) -> str:
        """Run etcdctl against this server (``stdin`` its input); its output."""
        done = subprocess.run(
            ["etcdctl", f"--endpoints={self.endpoint}", *args],
            env={**os.environ, "ETCDCTL_API": "3"},
            check=True,
            capture_output=True,
            text=True,
            input=stdin,
        )
        return done.stdout

    def _pid(self) -> int:
        return int((Path(self.env["MULTILOCK_ETCD_DIR"]) / "etcd.pid").read_text())


@pytest.fixture
def private_etcd(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Callable[..., PrivateEtcd]]:
    """``private_etcd(keep_data=False, args="")``: a started server (see
    :class:`PrivateEtcd`), stopped after the test."""
    if not (SCRIPTS / "etcd.sh").exists():
        pytest.skip("scripts/etcd.sh is not here (not a checkout of the repository)")
    servers: list[PrivateEtcd] = []

    def make(**options: Any) -> PrivateEtcd:
        server = PrivateEtcd(tmp_path / f"etcd{len(servers)}", **options)
        servers.append(server)
        try:
            server.start()
        except subprocess.CalledProcessError as exc:
            message = f"cannot start a private etcd: {exc.stderr.decode()[-500:]}"
            if require_backends(request.config):
                pytest.fail(message, pytrace=False)
            pytest.skip(message)
        return server

    yield make
    for server in servers:
        server.thaw()
        server.stop()


_START_TIMEOUT = 30.0


class TLSEtcd:
    """A single-member etcd whose client URL is ``https://`` only, presenting
    ``{cert}.crt`` of a :func:`test_ca` directory, wanting a client certificate of that
    CA when ``client_auth``. Started by the test itself (``scripts/etcd.sh`` checks
    health over plain HTTP)."""

    def __init__(self, state: Path, ca: Path, cert: str = "server", client_auth: bool = False):
        self.state = state
        self.ca = ca
        self.cert = cert
        self.client_auth = client_auth
        self.port = _free_port()
        self.process: subprocess.Popen[bytes] | None = None

    def url(self, host: str = "localhost", **options: Any) -> str:
        """A lock URL of a prefix of this server with TLS on and ``options``."""
        return f"etcd://{host}:{self.port}/tls?{urlencode({'tls': 'true', **options})}"

    def start(self) -> None:
        """Start it and return once it answers ``/health`` (within ``_START_TIMEOUT``)."""
        executable = shutil.which("etcd")
        if executable is None:
            raise RuntimeError("etcd is not installed")
        client, peer = f"https://127.0.0.1:{self.port}", f"http://127.0.0.1:{_free_port()}"
        self.process = subprocess.Popen(
            [
                executable,
                *("--name", "tls", "--data-dir", str(self.state / "data")),
                *("--listen-client-urls", client, "--advertise-client-urls", client),
                *("--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer),
                *("--initial-cluster", f"tls={peer}", "--initial-cluster-state", "new"),
                *("--cert-file", str(self.ca / f"{self.cert}.crt")),
                *("--key-file", str(self.ca / f"{self.cert}.key")),
                # A trusted CA makes etcd 3.4 want client certificates, asked or not.
                *(
                    ["--client-cert-auth", "--trusted-ca-file", str(self.ca / "ca.crt")]
                    if self.client_auth
                    else []
                ),
                *("--logger", "zap", "--log-level", "error"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + _START_TIMEOUT
        while not self._healthy():
            if self.process.poll() is not None:
                raise RuntimeError(f"etcd exited at start ({self.process.returncode})")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"etcd did not answer within {_START_TIMEOUT:g}s")
            time.sleep(0.05)

    def _healthy(self) -> bool:
        # Trusts the test CA whatever name the certificate has; shows the client's.
        context = ssl.create_default_context(cafile=self.ca / "ca.crt")
        context.check_hostname = False
        context.load_cert_chain(self.ca / "client.crt", self.ca / "client.key")
        try:
            with (
                socket.create_connection(("127.0.0.1", self.port), timeout=1) as raw,
                context.wrap_socket(raw) as sock,
            ):
                sock.sendall(b"GET /health HTTP/1.0\r\nHost: localhost\r\n\r\n")
                return b'"health":"true"' in sock.recv(4096)
        except OSError:
            return False

    def stop(self) -> None:
        """Kill it (SIGCONT first, in case a test froze it) and wait for it to exit."""
        if self.process is not None:
            self.process.send_signal(signal.SIGCONT)
            self.process.kill()
            self.process.wait(timeout=10)
            self.process = None

    def freeze(self) -> None:
        """SIGSTOP: connections stay open, nothing answers."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT."""
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)


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
                message = f"cannot start a TLS etcd: {exc}"
                if require_backends(request.config):
                    pytest.fail(message, pytrace=False)
                pytest.skip(message)
            servers[cert, client_auth] = server
        return servers[cert, client_auth]

    yield make
    for server in servers.values():
        server.stop()
