"""Network namespaces the tests make themselves, joined to the host by veth pairs
whose link a test can cut.

A cut drops every packet, both ways, and closes nothing: a ``pfifo`` queue of length
0 on both ends of the veth pair, so that the kernel neither delivers nor answers
(no RST, no ICMP) -- what a dead cable or switch does. ``heal()`` puts the links'
default queues back. Needs root and iproute2 (``ip``, ``tc``); without them the test
is skipped (or fails when every backend is required).
"""

from __future__ import annotations

import ipaddress
import os
import random
import shutil
import subprocess
import uuid

import pytest

from multilock.testing._servers import unavailable

__all__ = ["Link", "Namespace"]

_BLOCK = ipaddress.IPv4Network("10.213.0.0/16")  # the /30s of the links come from here


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


class Link:
    """A veth pair: ``host_ip`` on the host's end, ``ns_ip`` in the namespace."""

    def __init__(self, namespace: str, tag: str, subnet: ipaddress.IPv4Network) -> None:
        self.namespace = namespace
        self.host_dev, self.ns_dev = f"{tag}h", f"{tag}n"
        first, second = list(subnet.hosts())
        self.host_ip, self.ns_ip = str(first), str(second)
        _ip("link", "add", self.host_dev, "type", "veth", "peer", "name", self.ns_dev)
        _ip("link", "set", self.ns_dev, "netns", namespace)
        _ip("addr", "add", f"{self.host_ip}/30", "dev", self.host_dev)
        _ip("link", "set", self.host_dev, "up")
        _ip("-n", namespace, "addr", "add", f"{self.ns_ip}/30", "dev", self.ns_dev)
        _ip("-n", namespace, "link", "set", self.ns_dev, "up")

    def cut(self) -> None:
        """Drop every packet both ways; every connection stays open."""
        for where in ((), ("-n", self.namespace)):
            dev = self.host_dev if not where else self.ns_dev
            subprocess.run(
                ["tc", *where, "qdisc", "replace", "dev", dev, "root", "pfifo", "limit", "0"],
                check=True,
                capture_output=True,
                timeout=10,
            )

    def heal(self) -> None:
        """Forward packets again."""
        for where in ((), ("-n", self.namespace)):
            dev = self.host_dev if not where else self.ns_dev
            subprocess.run(
                ["tc", *where, "qdisc", "del", "dev", dev, "root"],
                check=False,  # not cut: nothing to delete
                capture_output=True,
                timeout=10,
            )


class Namespace:
    """A network namespace of the test's own (``ip netns``), with its loopback up."""

    def __init__(self, config: pytest.Config) -> None:
        if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None:
            unavailable(config, "network namespaces need root and iproute2 (ip, tc)")
        self.tag = f"mlr{uuid.uuid4().hex[:6]}"
        self.name = self.tag
        self.links: list[Link] = []
        try:
            _ip("netns", "add", self.name)
            _ip("-n", self.name, "link", "set", "lo", "up")
        except subprocess.CalledProcessError as exc:
            unavailable(config, f"cannot make a network namespace: {exc.stderr.decode().strip()}")

    def link(self) -> Link:
        """A new veth pair into the namespace, on a /30 no interface of the host uses."""
        taken = subprocess.run(
            ["ip", "-o", "-4", "addr", "show"], check=True, capture_output=True, text=True
        ).stdout
        subnets = list(_BLOCK.subnets(new_prefix=30))
        while True:
            subnet = random.choice(subnets)
            if not any(str(host) + "/" in taken for host in subnet):
                break
        link = Link(self.name, f"{self.tag}{len(self.links)}", subnet)
        self.links.append(link)
        return link

    def command(self, *argv: str) -> tuple[str, ...]:
        """``argv`` run inside the namespace."""
        return ("ip", "netns", "exec", self.name, *argv)

    def remove(self) -> None:
        """Delete the links and the namespace (and so every socket left in it)."""
        for link in self.links:
            subprocess.run(["ip", "link", "del", link.host_dev], check=False, capture_output=True)
        subprocess.run(["ip", "netns", "del", self.name], check=False, capture_output=True)
