"""Private Redis servers: a ``redis-server`` on a free port that a test may stop, freeze,
restart (:class:`RedisServer`), and topologies of them -- a Redis Cluster
(:class:`Cluster`), a primary that Sentinels watch (:class:`Sentinels`)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import redis
from redis.crc import key_slot

from .._poll import poll
from . import unavailable
from .process import ChildServer, free_port

__all__ = ["CLUSTER_NODE_TIMEOUT_MS", "DOWN_AFTER_MS", "Cluster", "RedisServer", "Sentinels"]

_START_TIMEOUT = 10.0


class RedisServer(ChildServer):
    """A private ``redis-server`` process that a test may stop, freeze and start again.

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
        poll(f"redis-server on port {self.port} answering", self._answers, _START_TIMEOUT)

    def _answers(self) -> bool:
        assert self.process is not None
        try:
            with self.admin() as client:
                client.ping()
        except redis.ConnectionError:
            if self.process.poll() is None:
                return False
            if self.tls:
                pytest.skip("this redis-server cannot serve TLS")
            raise RuntimeError(f"redis-server on port {self.port} did not start") from None
        return True

    def remove(self) -> None:
        """Stop it and delete its socket directory."""
        self.stop()
        shutil.rmtree(self.socket_path.parent, ignore_errors=True)


# -- topologies: a Redis Cluster, and a primary that Sentinel watches ----------------
#
# Failure detection is tuned down to about a second, so that a failover takes seconds,
# not the production defaults' tens of seconds: the cluster's nodes time a node out
# after CLUSTER_NODE_TIMEOUT_MS, the Sentinels call a primary down after DOWN_AFTER_MS
# (quorum 2 of 3). Every process is a private redis-server (or Debian's redis-sentinel)
# on a free loopback port, its files in the test's own directory.

CLUSTER_NODE_TIMEOUT_MS = 1000
DOWN_AFTER_MS = 1000
SERVICE = "mymaster"
_READY_WITHIN = 30.0  # seconds for a topology to form on a loaded machine


def _installed(config: pytest.Config, command: str, package: str) -> str:
    """The path of ``command``; the test is skipped (or fails) without it."""
    path = shutil.which(command)
    if path is None:
        unavailable(config, f"{command} is not installed (Debian's {package})")
    return path


def _ask(port: int, *command: str, host: str = "127.0.0.1") -> object:
    """One command to the server on ``port``; ``None`` when it cannot be asked."""
    try:
        with redis.Redis(host, port, socket_timeout=2, socket_connect_timeout=2) as client:
            return client.execute_command(*command)
    except redis.RedisError:
        return None


class Cluster:
    """Three primaries and three replicas (``redis-server --cluster-enabled``), joined
    by ``redis-cli --cluster create``."""

    def __init__(self, directory: Path) -> None:
        self.nodes: list[RedisServer] = []
        for i in range(6):
            home = directory / f"node-{i}"
            home.mkdir(parents=True)
            options = {
                "--cluster-enabled": "yes",
                "--cluster-config-file": "nodes.conf",
                "--cluster-node-timeout": str(CLUSTER_NODE_TIMEOUT_MS),
                "--cluster-port": str(free_port()),
                # A replica's first copy at once (the default waits 5 s for others).
                "--repl-diskless-sync-delay": "0",
            }
            args = tuple(part for pair in options.items() for part in pair)
            self.nodes.append(RedisServer(home, args=args))

    def start(self, config: pytest.Config) -> None:
        """Start the six servers, make them one cluster, and wait until every node
        says it is ok and every primary has its replica."""
        cli = _installed(config, "redis-cli", "redis-tools")
        for node in self.nodes:
            node.start()
        addresses = [f"127.0.0.1:{node.port}" for node in self.nodes]
        subprocess.run(
            [cli, "--cluster", "create", *addresses, "--cluster-replicas", "1", "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=_READY_WITHIN,
        )
        poll(
            "every cluster node is ok and every primary has a replica", self._formed, _READY_WITHIN
        )

    def _formed(self) -> bool:
        for node in self.alive():
            info = _ask(node.port, "CLUSTER", "INFO")
            if not isinstance(info, str | bytes) or b"cluster_state:ok" not in _bytes(info):
                return False
        roles = self.roles()
        primaries = [port for port, primary in roles.items() if primary is None]
        if len(primaries) != 3 or not all(self.replica_of(port) for port in primaries):
            return False
        # Only a replica that has its copy can be promoted.
        replicas = [port for port, primary in roles.items() if primary is not None]
        return all(_copying(port) for port in replicas)

    @property
    def url(self) -> str:
        """The ``redis+cluster://`` URL naming two of its nodes (the others are found)."""
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port},127.0.0.1:{self.nodes[1].port}/"

    def alive(self) -> list[RedisServer]:
        """The nodes whose process runs."""
        return [node for node in self.nodes if node.process is not None]

    def _cluster_nodes(self) -> list[list[str]]:
        """``CLUSTER NODES`` as a live node sees it, one list of fields per node."""
        for node in self.alive():
            answer = _ask(node.port, "CLUSTER", "NODES")
            if answer is not None:
                return [line.split() for line in _bytes(answer).decode().splitlines()]
        raise AssertionError("no cluster node answers")

    def roles(self) -> dict[int, int | None]:
        """Each live, connected node's port, and its primary's port (``None`` for a
        primary), as the cluster sees them."""
        rows = self._cluster_nodes()
        ports = {row[0]: int(row[1].split("@")[0].rsplit(":", 1)[1]) for row in rows}
        roles: dict[int, int | None] = {}
        for row in rows:
            flags = row[2].split(",")
            if "fail" in flags or "fail?" in flags or row[7] != "connected":
                continue
            port = ports[row[0]]
            roles[port] = None if "master" in flags else ports.get(row[3])
        return roles

    def primary_for(self, key: str) -> RedisServer:
        """The node serving ``key``'s slot now."""
        slot = key_slot(key.encode())
        for row in self._cluster_nodes():
            if "master" not in row[2].split(",") or "fail" in row[2].split(","):
                continue
            for part in row[8:]:
                first, _, last = part.partition("-")
                if not first.isdigit():
                    continue  # a slot being imported or migrated: [slot->-id]
                if int(first) <= slot <= int(last or first):
                    return self.node(int(row[1].split("@")[0].rsplit(":", 1)[1]))
        raise AssertionError(f"no primary serves slot {slot}")

    def replica_of(self, primary_port: int) -> RedisServer | None:
        """A connected replica of the primary on ``primary_port``."""
        replicas = [port for port, primary in self.roles().items() if primary == primary_port]
        return self.node(replicas[0]) if replicas else None

    def node(self, port: int) -> RedisServer:
        """The node listening on ``port``."""
        return next(node for node in self.nodes if node.port == port)

    def wait_promoted(self, old: RedisServer, key: str, within: float) -> RedisServer:
        """Wait until another node serves ``key``'s slot (once ``old`` was killed)."""

        def promoted() -> RedisServer | None:
            try:
                node = self.primary_for(key)
            except AssertionError:
                return None
            return node if node is not old else None

        return poll(f"a replica took over from port {old.port}", promoted, within, 0.01)

    def remove(self) -> None:
        """Kill every node and delete their sockets."""
        for node in self.nodes:
            node.remove()


class Sentinels:
    """A primary with ``replicas`` replicas, and three Sentinels (Debian's
    ``redis-sentinel``) watching it as ``mymaster``, quorum 2.

    The primary listens on ``primary_host``, the replicas on ``replica_host``, run by
    ``replica_prefix`` (a network namespace's ``ip netns exec``, to cut their link);
    the Sentinels on the loopback.
    """

    def __init__(
        self,
        directory: Path,
        replicas: int = 1,
        primary_host: str = "127.0.0.1",
        replica_host: str = "127.0.0.1",
        replica_prefix: tuple[str, ...] = (),
    ) -> None:
        self.directory = directory
        (directory / "primary").mkdir(parents=True)
        quick = ("--repl-diskless-sync-delay", "0")  # a replica's first copy at once
        self.primary = RedisServer(directory / "primary", args=quick, host=primary_host)
        self.replicas: list[RedisServer] = []
        for i in range(replicas):
            (directory / f"replica-{i}").mkdir()
            follow = ("--replicaof", primary_host, str(self.primary.port))
            self.replicas.append(
                RedisServer(
                    directory / f"replica-{i}",
                    args=follow,
                    host=replica_host,
                    prefix=replica_prefix,
                )
            )
        self.ports = [free_port() for _ in range(3)]
        self.processes: list[subprocess.Popen[bytes]] = []

    @property
    def servers(self) -> list[RedisServer]:
        """The primary and its replicas (as first started)."""
        return [self.primary, *self.replicas]

    @property
    def url(self) -> str:
        """The ``redis+sentinel://`` URL naming the three Sentinels."""
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.ports)
        return f"redis+sentinel://{hosts}/{SERVICE}"

    def start(self, config: pytest.Config) -> None:
        """Start the servers, then the Sentinels; wait until the replicas copy the
        primary and every Sentinel knows the replicas and the other Sentinels."""
        executable = _installed(config, "redis-sentinel", "redis-sentinel")
        for server in self.servers:
            server.start()
        poll("the replicas copy the primary", self._replicating, _READY_WITHIN)
        for i, port in enumerate(self.ports):
            home = self.directory / f"sentinel-{i}"
            home.mkdir()
            conf = home / "sentinel.conf"  # Sentinel rewrites it: a file of its own
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {home}\n"
                # Their address to each other, whatever address reaches the primary.
                "sentinel announce-ip 127.0.0.1\n"
                f"sentinel monitor {SERVICE} {self.primary.host} {self.primary.port} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {SERVICE} 10000\n"
                f"sentinel parallel-syncs {SERVICE} 1\n"
            )
            self.processes.append(
                subprocess.Popen(
                    [executable, str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
                )
            )
        poll("every Sentinel knows the replicas and the others", self._watching, _READY_WITHIN)

    def _replicating(self) -> bool:
        return all(_copying(replica.port, replica.host) for replica in self.replicas)

    def _watching(self) -> bool:
        for port in self.ports:
            replicas = _ask(port, "SENTINEL", "REPLICAS", SERVICE)
            others = _ask(port, "SENTINEL", "SENTINELS", SERVICE)
            if not isinstance(replicas, list) or len(replicas) < len(self.replicas):
                return False
            if not isinstance(others, list) or len(others) < len(self.ports) - 1:
                return False
        return True

    def primary_port(self) -> int | None:
        """The primary's port as a Sentinel that answers says it is."""
        for port in self.ports:
            answer = _ask(port, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)
            if isinstance(answer, list) and len(answer) == 2:
                return int(answer[1])
        return None

    def server(self, port: int) -> RedisServer:
        """The primary or replica listening on ``port``."""
        return next(server for server in self.servers if server.port == port)

    def wait_promoted(self, old: RedisServer, within: float) -> RedisServer:
        """Wait until the Sentinels name another primary than ``old``, and it says it is one."""

        def promoted() -> RedisServer | None:
            port = self.primary_port()
            if port is None or port == old.port:
                return None
            new = self.server(port)
            role = _ask(port, "ROLE", host=new.host)
            return new if isinstance(role, list) and role[0] == b"master" else None

        return poll(f"a replica took over from port {old.port}", promoted, within, 0.01)

    def remove(self) -> None:
        """Kill the Sentinels and the servers."""
        for process in self.processes:
            process.kill()
            process.wait(timeout=10)
        for server in self.servers:
            server.remove()


def _copying(port: int, host: str = "127.0.0.1") -> bool:
    """Whether the replica on ``port`` has its primary's data and follows it."""
    info = _ask(port, "INFO", "replication", host=host)  # parsed by redis-py
    return isinstance(info, dict) and info.get("master_link_status") == "up"


def _bytes(answer: object) -> bytes:
    return answer if isinstance(answer, bytes) else str(answer).encode()
