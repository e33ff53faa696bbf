"""A private ``nats-server`` with JetStream on a free port (:class:`PrivateNats`), and the
flags that make it speak TLS (:func:`tls_flags`)."""

from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path

from .._poll import poll
from .process import ChildServer, free_port

__all__ = ["PrivateNats", "tls_flags"]


class PrivateNats(ChildServer):
    """A ``nats-server`` with JetStream of our own: ``start()``, ``stop()``, ``freeze()``."""

    def __init__(self, store: Path, *auth: str) -> None:
        """``auth``: more ``nats-server`` flags (credentials, TLS)."""
        self.port = free_port()
        self.store = store
        self.auth = auth

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
        poll(f"nats-server on port {self.port} taking connections", self._answers, 15, 0.05)

    def _answers(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(f"nats-server on port {self.port} did not start")
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
        except OSError:
            return False
        return True


def tls_flags(ca: Path, cert: str = "server", client_auth: bool = False) -> tuple[str, ...]:
    """``nats-server`` flags for TLS with ``{cert}.crt`` of the test CA ``ca``, wanting a
    client certificate of that CA when ``client_auth``."""
    flags: tuple[str, ...] = ("--tls", "--tlscert", str(ca / f"{cert}.crt"))
    flags += ("--tlskey", str(ca / f"{cert}.key"))
    if client_auth:
        flags += ("--tlsverify", "--tlscacert", str(ca / "ca.crt"))
    return flags
