"""A link that delays every byte by a fixed time each way: a LAN on loopback.

On loopback a round trip costs tens of microseconds, so a benchmark counting round
trips mostly measures the client's own speed; through this proxy each round trip
costs at least twice the delay, as on a network, and what is O(1) round trips and
what is O(N) shows. The proxy is the tests' :class:`multilock.testing.TcpProxy`, run
in a process of its own (:func:`delayed`), so that its threads do not compete with
the measured client for the GIL.

    python benchmarks/_delay_proxy.py HOST PORT DELAY_MS   # prints its port, then serves
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from multilock.testing import TcpProxy


@contextmanager
def delayed(host: str, port: int, delay_ms: float) -> Iterator[int]:
    """Run a proxy to ``host:port`` adding ``delay_ms`` each way; yields its local port."""
    proxy = subprocess.Popen(
        [sys.executable, __file__, host, str(port), str(delay_ms)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proxy.stdout is not None
        line = proxy.stdout.readline()
        if not line:
            raise RuntimeError("the delaying proxy did not start")
        yield int(line)
    finally:
        proxy.kill()
        proxy.wait()


def _serve(host: str, port: int, delay: float) -> None:
    with TcpProxy((host, port)) as proxy:
        proxy.delay(delay)
        print(proxy.port, flush=True)
        threading.Event().wait()  # until killed


if __name__ == "__main__":
    _serve(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]) / 1000)
