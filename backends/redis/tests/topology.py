"""Redis topologies the tests start themselves: a Redis Cluster, and a primary that
Sentinel watches.

Every process is a private ``redis-server`` (or Debian's ``redis-sentinel``) on a
free port of the loopback, with its files in the test's own directory; the shared
server is never touched. Failure detection is tuned down to about a second, so that
a failover takes seconds, not the production defaults' tens of seconds:

* the cluster's nodes time a node out after :data:`CLUSTER_NODE_TIMEOUT_MS`;
* the Sentinels call a primary down after :data:`DOWN_AFTER_MS` (quorum 2 of 3).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import NoReturn

import pytest
import redis
from redis.crc import key_slot

from multilock.testing import poll, require_backends

from .conftest import RedisServer, free_port

__all__ = ["CLUSTER_NODE_TIMEOUT_MS", "DOWN_AFTER_MS", "Cluster", "Sentinels", "unavailable"]

CLUSTER_NODE_TIMEOUT_MS = 1000
DOWN_AFTER_MS = 1000
SERVICE = "mymaster"
_READY_WITHIN = 30.0  # seconds for a topology to form on a loaded machine


def unavailable(config: pytest.Config, message: str) -> NoReturn:
    """Skip the test for a missing tool -- or fail it when every backend is required (CI)."""
    if require_backends(config):
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


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
