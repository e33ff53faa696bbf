"""A network namespace of the test's own, linked to the host by a veth pair, whose
link to a server can be cut by dropping packets: nothing is closed, refused or reset,
as when a cable is pulled or a switch dies between a holder and its server.

Needs root, ``ip`` (iproute2) and ``nft`` (nftables): ``scripts/test`` installs them
where missing. Servers that the namespace must reach listen on :attr:`Namespace.host`
(the host's end of the veth pair), a local address that the host's own clients reach
as well.
"""

from __future__ import annotations

import ipaddress
import os
import random
import shutil
import subprocess
from collections.abc import Sequence
from typing import Any

import pytest

from multilock.testing import require_backends

__all__ = ["Namespace", "namespace_or_skip"]

_TABLE = "multilock_cut"


def _ip(*args: str) -> str:
    done = subprocess.run(["ip", *args], check=True, capture_output=True, text=True)
    return done.stdout


class Namespace:
    """``ip netns`` namespace ``name`` with a /30 link to the host: the host's end is
    :attr:`host`, the namespace's :attr:`address`. Removed by :meth:`remove`."""

    _count = 0

    def __init__(self) -> None:
        Namespace._count += 1
        tag = f"{os.getpid() % 100000}x{Namespace._count}"
        self.name = f"multilock-{tag}"
        self._veth = f"mlh{tag}"  # the host's end; interface names have 15 bytes at most
        network = self._free_network()
        first, second = list(network.hosts())
        self.host, self.address = str(first), str(second)
        _ip("netns", "add", self.name)
        try:
            _ip(
                "link",
                "add",
                self._veth,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                self.name,
            )
            _ip("addr", "add", f"{self.host}/30", "dev", self._veth)
            _ip("link", "set", self._veth, "up")
            _ip("-n", self.name, "addr", "add", f"{self.address}/30", "dev", "eth0")
            _ip("-n", self.name, "link", "set", "eth0", "up")
            _ip("-n", self.name, "link", "set", "lo", "up")
        except BaseException:
            self.remove()
            raise

    @staticmethod
    def _free_network() -> ipaddress.IPv4Network:
        """A /30 in 10.200.0.0/13 that no interface or route of the host uses."""
        taken = _ip("-o", "-4", "addr", "show") + _ip("-4", "route", "show", "table", "all")
        used = []
        for word in taken.split():
            try:
                used.append(ipaddress.ip_network(word, strict=False))
            except ValueError:
                continue  # not an address
        pool = ipaddress.ip_network("10.200.0.0/13")
        for _ in range(1000):
            offset = random.randrange(pool.num_addresses // 4) * 4
            candidate = ipaddress.IPv4Network(f"{pool.network_address + offset}/30")
            if not any(candidate.overlaps(net) for net in used):
                return candidate
        raise RuntimeError("no free /30 in 10.200.0.0/13")

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside the namespace."""
        return ["ip", "netns", "exec", self.name, *argv]

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[str]:
        """Start ``argv`` inside the namespace (text mode)."""
        return subprocess.Popen(self.command(argv), text=True, **kwargs)

    def cut(self, port: int) -> None:
        """Drop every packet between the namespace and the host's TCP ``port``, both ways,
        from now on: established connections stay open, and nothing answers."""
        rules = f"""
        table inet {_TABLE} {{
            chain output {{ type filter hook output priority 0; tcp dport {port} drop; }}
            chain input {{ type filter hook input priority 0; tcp sport {port} drop; }}
        }}
        """
        subprocess.run(
            self.command(["nft", "-f", "-"]),
            input=rules,
            check=True,
            capture_output=True,
            text=True,
        )

    def heal(self) -> None:
        """Remove every cut."""
        subprocess.run(
            self.command(["nft", "delete", "table", "inet", _TABLE]),
            check=False,
            capture_output=True,
        )

    def remove(self) -> None:
        """Delete the namespace, and with it the veth pair."""
        subprocess.run(["ip", "netns", "del", self.name], check=False, capture_output=True)
        subprocess.run(["ip", "link", "del", self._veth], check=False, capture_output=True)


def namespace_or_skip(config: pytest.Config) -> Namespace:
    """A new :class:`Namespace`; where that cannot be (not root, no ``ip`` or ``nft``),
    a skip -- or a failure when backends are required, as in CI."""
    missing = [tool for tool in ("ip", "nft") if shutil.which(tool) is None]
    problem = None
    if os.geteuid() != 0:
        problem = "network namespaces need root"
    elif missing:
        problem = f"{' and '.join(missing)} not installed (iproute2, nftables)"
    if problem is None:
        try:
            return Namespace()
        except (OSError, subprocess.CalledProcessError) as exc:
            stderr = getattr(exc, "stderr", "") or ""
            problem = f"cannot make a network namespace: {exc} {stderr}".strip()
    if require_backends(config):
        pytest.fail(problem, pytrace=False)
    pytest.skip(problem)
