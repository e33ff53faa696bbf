"""Round trips, counted through a proxy that delays every answer of the real server.

With each answer ``DELAY`` late, a request that needs one round trip takes
about ``DELAY``, two take ``2 * DELAY``: acquire and release must take one, and
``try_acquire_many`` of many names one as well (its creates are all in flight
together).
"""

from __future__ import annotations

import asyncio
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import multilock
from multilock.backend import LockURL

DELAY = 0.15
ONE_TRIP = 1.8 * DELAY  # a second round trip would need 2 * DELAY


class LatencyProxy:
    """Forwards TCP to ``upstream``; the upstream's bytes reach the client ``delay`` late."""

    def __init__(self, upstream: tuple[str, int], delay: float) -> None:
        self.upstream = upstream
        self.delay = delay
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = [self.listener]
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def _spawn(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self.threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            server = socket.create_connection(self.upstream)
            self.sockets += [client, server]
            late: queue.Queue[tuple[float, bytes]] = queue.Queue()
            self._spawn(self._pump, client, server, None)
            self._spawn(self._pump, server, client, late)
            self._spawn(self._deliver, late, client)

    def _pump(self, src: socket.socket, dst: socket.socket, late: queue.Queue[Any] | None) -> None:
        try:
            while data := src.recv(65536):
                if late is None:
                    dst.sendall(data)
                else:
                    late.put((time.monotonic() + self.delay, data))
        except OSError:
            pass
        if late is not None:
            late.put((0.0, b""))
        else:
            _close(dst)

    def _deliver(self, late: queue.Queue[tuple[float, bytes]], dst: socket.socket) -> None:
        while True:
            due, data = late.get()
            if not data:
                _close(dst)
                return
            time.sleep(max(0.0, due - time.monotonic()))
            try:
                dst.sendall(data)
            except OSError:
                return

    def close(self) -> None:
        for sock in self.sockets:
            _close(sock)
        for thread in self.threads:
            thread.join(timeout=5)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


@pytest.fixture
def slow_url(make_url: Callable[..., str]) -> Iterator[str]:
    """The test's URL, through a proxy that makes every round trip ``DELAY`` long."""
    url = LockURL.parse(make_url())
    proxy = LatencyProxy((url.host or "127.0.0.1", url.port or 2181), DELAY)
    try:
        yield f"zookeeper://127.0.0.1:{proxy.port}{url.path}"
    finally:
        proxy.close()


def timed(call: Callable[[], object]) -> tuple[object, float]:
    start = time.monotonic()
    result = call()
    return result, time.monotonic() - start


def test_acquire_and_release_are_one_round_trip_each(slow_url: str) -> None:
    with multilock.connect(slow_url) as locker:
        warm = locker.try_acquire("warm-up")  # connects, and creates the chroot
        assert warm is not None
        lease, took = timed(lambda: locker.try_acquire("job"))
        assert lease is not None
        assert DELAY <= took < ONE_TRIP, f"acquire took {took:.3f} s"
        refused, took = timed(lambda: locker.try_acquire("job"))
        assert refused is None
        assert took < ONE_TRIP, f"a refused acquire took {took:.3f} s"
        released, took = timed(lambda: lease.release())  # type: ignore[attr-defined]
        assert released is True
        assert took < ONE_TRIP, f"release took {took:.3f} s"


def test_try_acquire_many_is_one_round_trip(slow_url: str) -> None:
    names = [f"job-{i}" for i in range(20)]
    with multilock.connect(slow_url) as locker:
        assert locker.try_acquire("job-3") is not None  # one of them is held already
        leases, took = timed(lambda: locker.try_acquire_many(names))
        assert took < ONE_TRIP, f"20 acquires took {took:.3f} s"
        assert [name for name, lease in leases.items() if lease is None] == ["job-3"]  # type: ignore[attr-defined]


def test_async_try_acquire_many_is_one_round_trip(slow_url: str) -> None:
    names = [f"job-{i}" for i in range(20)]

    async def main() -> None:
        async with multilock.connect_async(slow_url) as locker:
            assert await locker.try_acquire("warm-up") is not None
            start = time.monotonic()
            leases = await locker.try_acquire_many(names)
            took = time.monotonic() - start
            assert took < ONE_TRIP, f"20 acquires took {took:.3f} s"
            assert all(lease is not None for lease in leases.values())

    asyncio.run(main())
