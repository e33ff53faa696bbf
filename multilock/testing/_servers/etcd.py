"""Private etcd servers: a single member run by the repository's ``scripts/etcd.sh``
(:class:`PrivateEtcd`), or one whose client URL is ``https://`` only (:class:`TLSEtcd`)."""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from .._poll import poll
from .process import ChildServer, ScriptedServer, free_port

__all__ = ["PrivateEtcd", "TLSEtcd"]

_START_TIMEOUT = 30.0


class PrivateEtcd(ScriptedServer):
    """One single-member etcd of our own: ``start()``, ``stop()``, ``kill()``,
    ``freeze()``; ``args``: more ``etcd`` flags."""

    def __init__(
        self, script: Path, state: Path, *, keep_data: bool = False, args: str = ""
    ) -> None:
        self.port = free_port()
        env = {
            "MULTILOCK_ETCD_PORT": str(self.port),
            "MULTILOCK_ETCD_PEER_PORT": str(free_port()),
            "MULTILOCK_ETCD_DIR": str(state),
            "MULTILOCK_ETCD_KEEP_DATA": "1" if keep_data else "0",
            "MULTILOCK_ETCD_ARGS": args,
        }
        super().__init__(script, env, state / "etcd.pid")

    @property
    def url(self) -> str:
        """The lock URL of a prefix of this server, without options."""
        return f"etcd://127.0.0.1:{self.port}/faults"

    @property
    def endpoint(self) -> str:
        """Its client URL, for etcdctl."""
        return f"http://127.0.0.1:{self.port}"

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


class TLSEtcd(ChildServer):
    """A single-member etcd whose client URL is ``https://`` only, presenting
    ``{cert}.crt`` of a :func:`test_ca` directory, wanting a client certificate of that
    CA when ``client_auth``. Started by the test itself (``scripts/etcd.sh`` checks
    health over plain HTTP)."""

    def __init__(self, state: Path, ca: Path, cert: str = "server", client_auth: bool = False):
        self.state = state
        self.ca = ca
        self.cert = cert
        self.client_auth = client_auth
        self.port = free_port()

    def url(self, host: str = "localhost", **options: Any) -> str:
        """A lock URL of a prefix of this server with TLS on and ``options``."""
        return f"etcd://{host}:{self.port}/tls?{urlencode({'tls': 'true', **options})}"

    def start(self) -> None:
        """Start it and return once it answers ``/health`` (within ``_START_TIMEOUT``)."""
        executable = shutil.which("etcd")
        if executable is None:
            raise RuntimeError("etcd is not installed")
        client, peer = f"https://127.0.0.1:{self.port}", f"http://127.0.0.1:{free_port()}"
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
        try:
            poll(f"etcd on port {self.port} healthy", self._healthy, _START_TIMEOUT, 0.05)
        except AssertionError:
            self.stop()
            raise RuntimeError(f"etcd did not answer within {_START_TIMEOUT:g}s") from None

    def _healthy(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(f"etcd exited at start ({self.process.returncode})")
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
