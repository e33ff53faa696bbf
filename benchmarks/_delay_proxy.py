"""A TCP proxy that delays every byte by a fixed time each way: a LAN on loopback.

On loopback a round trip costs tens of microseconds, so a benchmark counting round
trips mostly measures the client's own speed; through this proxy each round trip
costs at least twice the delay, as on a network, and what is O(1) round trips and
what is O(N) shows. It runs in a process of its own (:func:`delayed`), so that its
threads do not compete with the measured client for the GIL.

    python benchmarks/_delay_proxy.py HOST PORT DELAY_MS   # prints its port, then serves
"""

from __future__ import annotations

import queue
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


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


def _pump(
    source: socket.socket, target: socket.socket, delay: float, done: threading.Barrier
) -> None:
    """Copy ``source`` to ``target``, each chunk sent ``delay`` seconds after it came.

    Reading and sending are separate threads: a chunk waiting for its time must not
    hold up the reading of the next, or delays would add up within one answer.
    """
    chunks: queue.SimpleQueue[tuple[float, bytes]] = queue.SimpleQueue()

    def read() -> None:
        while True:
            try:
                data = source.recv(1 << 16)
            except OSError:
                data = b""
            chunks.put((time.monotonic() + delay, data))
            if not data:
                return

    def send() -> None:
        while True:
            due, data = chunks.get()
            pause = due - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            try:
                if not data:
                    target.shutdown(socket.SHUT_WR)
                    break
                target.sendall(data)
            except OSError:
                break
        done.wait()

    threading.Thread(target=read, daemon=True).start()
    threading.Thread(target=send, daemon=True).start()


def _serve(host: str, port: int, delay: float) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    print(listener.getsockname()[1], flush=True)
    while True:
        client, _ = listener.accept()
        try:
            server = socket.create_connection((host, port))
        except OSError:
            client.close()
            continue
        for sock in (client, server):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        done = _closer(client, server)
        _pump(client, server, delay, done)
        _pump(server, client, delay, done)


def _closer(*sockets: socket.socket) -> threading.Barrier:
    """A barrier for the two directions of a connection: its sockets are closed
    once both have ended."""

    def close() -> None:
        for sock in sockets:
            sock.close()

    return threading.Barrier(2, action=close)


if __name__ == "__main__":
    _serve(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]) / 1000)
