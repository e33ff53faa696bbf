"""Fixtures of the ZooKeeper backend's tests, written as a third party would.

The server comes from ``MULTILOCK_ZOOKEEPER_URL`` (default: the local test
server that ``scripts/zookeeper.sh start`` runs) through
:func:`multilock.testing.server_url`, which skips when it is down -- or fails
when backends are required, as in CI. Every test gets a chroot of its own.

Tests that break a server or need TLS get a private one (``private_zookeeper``),
run by the repository's ``scripts/zookeeper.sh``, with certificates from its
``scripts/test-ca``; they skip where those scripts are not (an installed sdist).
The topology tests get a 3-node ensemble of such servers (``zookeeper_ensemble``).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from kazoo.client import KazooClient

from multilock.backend import LockURL
from multilock.testing import require_backends, server_url
from multilock_zookeeper._config import Config

DEFAULT_URL = "zookeeper://127.0.0.1:2181/multilock-test"
SCRIPTS = Path(__file__).resolve().parents[3] / "scripts"


@pytest.fixture(scope="session")
def zookeeper_url(request: pytest.FixtureRequest) -> str:
    """The lock URL of the test server, reachable or skipped."""
    return server_url(request.config, os.environ.get("MULTILOCK_ZOOKEEPER_URL", DEFAULT_URL))


@pytest.fixture
def chroot(zookeeper_url: str) -> str:
    """A chroot unique to the test, under the test URL's."""
    base = LockURL.parse(zookeeper_url).path.rstrip("/") or "/multilock-test"
    return f"{base}/t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def make_url(zookeeper_url: str, chroot: str) -> Callable[..., str]:
    """``make_url(userinfo="", **options)``: the test server, the test's chroot, options."""
    parsed = LockURL.parse(zookeeper_url)
    hosts = ",".join(f"{host}:{port or 2181}" for host, port in parsed.hosts)

    def make(userinfo: str = "", **options: Any) -> str:
        query = f"?{urlencode(options)}" if options else ""
        at = f"{userinfo}@" if userinfo else ""
        return f"{parsed.scheme}://{at}{hosts}{chroot}{query}"

    return make


@pytest.fixture
def kazoo_client(zookeeper_url: str) -> Iterator[Callable[..., KazooClient]]:
    """``kazoo_client(**kwargs)``: a started plain kazoo client of the test server (as
    another application would have one), stopped after the test."""
    config = Config.from_url(LockURL.parse(zookeeper_url))
    clients: list[KazooClient] = []

    def make(**kwargs: Any) -> KazooClient:
        clients.append(KazooClient(**config.connection_options(), **kwargs))
        clients[-1].start(timeout=config.connect_timeout)
        return clients[-1]

    yield make
    for client in clients:
        client.stop()
        client.close()


@pytest.fixture
def admin(kazoo_client: Callable[..., KazooClient]) -> KazooClient:
    """A plain kazoo client without credentials, as another application would have."""
    return kazoo_client()


def _unavailable(config: pytest.Config, message: str) -> None:
    if require_backends(config):
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def free_port(address: str = "127.0.0.1") -> int:
    """A TCP port free on ``address`` a moment ago."""
    with socket.socket() as probe:
        probe.bind((address, 0))
        port: int = probe.getsockname()[1]
    return port


class PrivateZooKeeper:
    """One server of our own: ``start()``, ``stop()``, ``kill()``, ``url``.

    With ``tls`` (a :func:`test_ca` directory) it speaks TLS only, presenting
    ``{cert}.pem`` and asking clients for a certificate per ``client_auth``.
    ``address``: where clients connect (loopback by default). ``ensemble`` and
    ``myid``: a member of an ensemble (see :class:`ZooKeeperEnsemble`).
    """

    def __init__(
        self,
        state: Path,
        *,
        keep_data: bool = False,
        tls: Path | None = None,
        cert: str = "server",
        client_auth: str = "need",
        address: str = "127.0.0.1",
        ensemble: str | None = None,
        myid: int | None = None,
    ) -> None:
        self.address = address
        self.port = free_port(address)
        self.env = {
            **os.environ,
            "MULTILOCK_ZK_PORT": str(self.port),
            "MULTILOCK_ZK_ADDR": address,
            "MULTILOCK_ZK_DIR": str(state),
            "MULTILOCK_ZK_KEEP_DATA": "1" if keep_data else "0",
        }
        if tls is not None:
            self.env["MULTILOCK_ZK_TLS_DIR"] = str(tls)
            self.env["MULTILOCK_ZK_TLS_CERT"] = cert
            self.env["MULTILOCK_ZK_TLS_CLIENT_AUTH"] = client_auth
        if ensemble is not None:
            self.env["MULTILOCK_ZK_ENSEMBLE"] = ensemble
            self.env["MULTILOCK_ZK_MYID"] = str(myid)

    @property
    def url(self) -> str:
        """The lock URL of a chroot of this server, without options."""
        return f"zookeeper://{self.address}:{self.port}/faults"

    def mode(self) -> str | None:
        """``leader``, ``follower`` or ``standalone`` (``srvr``); ``None`` while it does
        not serve (down, or an ensemble member without a quorum)."""
        try:
            with socket.create_connection((self.address, self.port), timeout=1) as sock:
                sock.sendall(b"srvr")
                reply = b""
                while chunk := sock.recv(4096):
                    reply += chunk
        except OSError:
            return None
        for line in reply.decode(errors="replace").splitlines():
            if line.startswith("Mode:"):
                return line.split(":", 1)[1].strip()
        return None

    def _run(self, command: str) -> None:
        subprocess.run(
            ["bash", str(SCRIPTS / "zookeeper.sh"), command],
            env=self.env,
            check=True,
            capture_output=True,
        )

    def start(self) -> None:
        """Start the server; return once it answers."""
        self._run("start")

    def stop(self) -> None:
        """Stop the server (it closes its connections; sessions live on with keep_data)."""
        self.thaw()  # a frozen JVM would not stop
        self._run("stop")

    def kill(self) -> None:
        """SIGKILL the server: its connections are reset, as when its host crashes."""
        os.kill(self.pid(), signal.SIGKILL)

    def freeze(self) -> None:
        """Stop the server's process where it stands: a blackhole that keeps connections."""
        os.kill(self.pid(), signal.SIGSTOP)

    def thaw(self) -> None:
        """Let a frozen server go on."""
        try:
            os.kill(self.pid(), signal.SIGCONT)
        except (ProcessLookupError, FileNotFoundError):
            pass  # killed, or never started

    def pid(self) -> int:
        """The server's process id (as ``start`` recorded it)."""
        return int((Path(self.env["MULTILOCK_ZK_DIR"]) / "zookeeper.pid").read_text())


ENSEMBLE_READY = 60.0
"""Seconds a fresh ensemble (three JVMs on a loaded machine) may take to elect a leader."""


class ZooKeeperEnsemble:
    """Three :class:`PrivateZooKeeper` members of one ensemble on loopback, each on its
    own client, quorum and election ports, keeping their data across restarts (a
    member that comes back rejoins with its sessions)."""

    def __init__(self, state: Path, size: int = 3) -> None:
        peers = [(i, free_port(), free_port()) for i in range(1, size + 1)]
        ensemble = " ".join(f"{i}=127.0.0.1:{quorum}:{election}" for i, quorum, election in peers)
        self.members = [
            PrivateZooKeeper(state / f"zk{i}", keep_data=True, ensemble=ensemble, myid=i)
            for i, _, _ in peers
        ]

    def url(self, chroot: str = "/ensemble") -> str:
        """The lock URL naming every member, ``chroot`` as its path, without options."""
        hosts = ",".join(f"127.0.0.1:{member.port}" for member in self.members)
        return f"zookeeper://{hosts}{chroot}"

    def start(self) -> None:
        """Start every member at once; return when one of them leads and the others follow."""
        with ThreadPoolExecutor(len(self.members)) as pool:
            list(pool.map(PrivateZooKeeper.start, self.members))
        self.wait_serving(ENSEMBLE_READY)

    def wait_serving(self, within: float, members: list[PrivateZooKeeper] | None = None) -> int:
        """Wait until ``members`` (default: all) serve with one leader among them; the
        leader's index in :attr:`members`."""
        members = self.members if members is None else members
        deadline = time.monotonic() + within
        while True:
            modes = [member.mode() for member in members]
            if None not in modes and modes.count("leader") == 1:
                return self.members.index(members[modes.index("leader")])
            if time.monotonic() > deadline:
                raise AssertionError(f"the ensemble did not form within {within:g}s: {modes}")
            time.sleep(0.05)

    def leader(self) -> int:
        """The index of the member that leads now."""
        return self.wait_serving(ENSEMBLE_READY)

    def stop(self) -> None:
        """Stop every member."""
        for member in self.members:
            member.stop()


@pytest.fixture(scope="module")
def zookeeper_ensemble(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ZooKeeperEnsemble]:
    """A started 3-node :class:`ZooKeeperEnsemble` of the test module, stopped after it."""
    if not (SCRIPTS / "zookeeper.sh").exists():
        pytest.skip("scripts/zookeeper.sh is not here (not a checkout of the repository)")
    ensemble = ZooKeeperEnsemble(tmp_path_factory.mktemp("ensemble"))
    try:
        try:
            ensemble.start()
        except (subprocess.CalledProcessError, AssertionError) as exc:
            detail = (
                exc.stderr.decode()[-500:]
                if isinstance(exc, subprocess.CalledProcessError)
                else exc
            )
            _unavailable(request.config, f"cannot start a ZooKeeper ensemble: {detail}")
        yield ensemble
    finally:
        ensemble.stop()


@pytest.fixture
def private_zookeeper(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Callable[..., PrivateZooKeeper]]:
    """``private_zookeeper(keep_data=False, tls=None, ...)``: a started server (see
    :class:`PrivateZooKeeper`), stopped after the test.

    Restart with ``keep_data=True``: a server that comes back *without* its data
    refuses clients that have seen a later zxid (ZooKeeper's own rule against
    going back in time), so such a restart is a new ensemble, not a fault.
    """
    if not (SCRIPTS / "zookeeper.sh").exists():
        pytest.skip("scripts/zookeeper.sh is not here (not a checkout of the repository)")
    servers: list[PrivateZooKeeper] = []

    def make(**options: Any) -> PrivateZooKeeper:
        server = PrivateZooKeeper(tmp_path / f"zk{len(servers)}", **options)
        servers.append(server)
        try:
            server.start()
        except subprocess.CalledProcessError as exc:
            _unavailable(
                request.config, f"cannot start a private ZooKeeper: {exc.stderr.decode()[-500:]}"
            )
        return server

    yield make
    for server in servers:
        server.stop()
