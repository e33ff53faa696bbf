"""Private ZooKeeper servers, run by the repository's ``scripts/zookeeper.sh``: one of our
own (:class:`PrivateZooKeeper`) or a 3-node ensemble (:class:`ZooKeeperEnsemble`)."""

from __future__ import annotations

import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .._poll import poll
from .process import ScriptedServer, free_port

__all__ = ["ENSEMBLE_READY", "PrivateZooKeeper", "ZooKeeperEnsemble"]


class PrivateZooKeeper(ScriptedServer):
    """One server of our own: ``start()``, ``stop()``, ``kill()``, ``freeze()``, ``url``
    (its data kept across a restart with ``keep_data``: sessions live on).

        With ``tls`` (a :func:`test_ca` directory) it speaks TLS only, presenting
        ``{cert}.pem`` and asking clients for a certificate per ``client_auth``.
        ``address``: where clients connect (loopback by default). ``ensemble`` and
        ``myid``: a member of an ensemble (see :class:`ZooKeeperEnsemble`).
    """

    def __init__(
        self,
        script: Path,
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
        env = {
            "MULTILOCK_ZK_PORT": str(self.port),
            "MULTILOCK_ZK_ADDR": address,
            "MULTILOCK_ZK_DIR": str(state),
            "MULTILOCK_ZK_KEEP_DATA": "1" if keep_data else "0",
        }
        if tls is not None:
            env["MULTILOCK_ZK_TLS_DIR"] = str(tls)
            env["MULTILOCK_ZK_TLS_CERT"] = cert
            env["MULTILOCK_ZK_TLS_CLIENT_AUTH"] = client_auth
        if ensemble is not None:
            env["MULTILOCK_ZK_ENSEMBLE"] = ensemble
            env["MULTILOCK_ZK_MYID"] = str(myid)
        super().__init__(script, env, state / "zookeeper.pid")

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


ENSEMBLE_READY = 60.0
"""Seconds a fresh ensemble (three JVMs on a loaded machine) may take to elect a leader."""


class ZooKeeperEnsemble:
    """Three :class:`PrivateZooKeeper` members of one ensemble on loopback, each on its
    own client, quorum and election ports, keeping their data across restarts (a
    member that comes back rejoins with its sessions)."""

    def __init__(self, script: Path, state: Path, size: int = 3) -> None:
        peers = [(i, free_port(), free_port()) for i in range(1, size + 1)]
        ensemble = " ".join(f"{i}=127.0.0.1:{quorum}:{election}" for i, quorum, election in peers)
        self.members = [
            PrivateZooKeeper(script, state / f"zk{i}", keep_data=True, ensemble=ensemble, myid=i)
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
        modes: list[str | None] = []

        def formed() -> tuple[int] | None:
            modes[:] = [member.mode() for member in members]
            if None not in modes and modes.count("leader") == 1:
                return (self.members.index(members[modes.index("leader")]),)
            return None

        try:
            [leader] = poll("the ensemble forming", formed, within, every=0.05)
            return leader
        except AssertionError:
            raise AssertionError(f"the ensemble did not form within {within:g}s: {modes}") from None

    def leader(self) -> int:
        """The index of the member that leads now."""
        return self.wait_serving(ENSEMBLE_READY)

    def stop(self) -> None:
        """Stop every member."""
        for member in self.members:
            member.stop()
