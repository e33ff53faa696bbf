"""A TCP proxy that tests put between a client and its server to make the network
misbehave on command: slow, frozen, silent, resetting or trickling."""

from __future__ import annotations

import queue
import socket
import struct
import threading
import time
from types import TracebackType
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

__all__ = ["Direction", "TcpProxy"]

Direction = Literal["both", "requests", "answers"]
"""Which way a :meth:`TcpProxy.delay` applies: client to server ("requests"), server
to client ("answers"), or both."""

_CHUNK = 65536
_JOIN = 5.0  # seconds to wait for each thread at close: they are woken, not polled


class TcpProxy:
    """Forwards ``127.0.0.1:port`` to ``upstream`` until told to misbehave.

    A plain forwarder at first; the faults, each switched on and off from any thread:

    - :meth:`delay`: every chunk reaches the other end some time late (pipelined, as
      on a long link: delays do not add up within one answer);
    - :meth:`freeze`: nothing is forwarded, connections stay open and bytes wait --
      a hung server or proxy, which TCP never reports; all of it flows on a thaw;
    - :meth:`blackhole`: bytes vanish both ways, connections (and closes) are never
      reported either -- a link cut somewhere in between;
    - :meth:`reset`: every connection is reset (RST), and every new one while on;
    - :meth:`trickle`: answers come one byte at a time, ``gap`` seconds apart -- a
      peer too slow to ever finish, yet never silent long enough to time out;
    - :meth:`drop_connections`: reset every connection once, now.

    :attr:`sent` records every byte clients sent, as someone on the network sees it.
    Threads, not asyncio: sleeps are precise to well under a millisecond (an event
    loop's timers round up to one), which a delay of a fraction of a millisecond
    needs. :meth:`close` (or the ``with`` block's end) ends every connection and
    joins every thread.
    """

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.sent = bytearray()
        """Every byte clients sent through the proxy, in order of arrival."""
        self._state = threading.Condition()  # guards the switches; notified on changes
        self._delays: dict[str, float] = {"requests": 0.0, "answers": 0.0}
        self._gap: float | None = None
        self._frozen = False
        self._blackholed = False
        self._resetting = False
        self._closing = False
        self._drops = 0  # drop_connections() calls: one while a link is being made ends it
        self._links: set[_Link] = set()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        """The port clients connect to, on 127.0.0.1."""
        self._acceptor = threading.Thread(target=self._accept, name="tcp-proxy", daemon=True)
        self._acceptor.start()

    @classmethod
    def before(cls, url: str) -> TcpProxy:
        """A proxy in front of the (first) server of lock URL ``url``."""
        first = urlsplit(url).netloc.rsplit("@", 1)[-1].split(",")[0]
        host, _, port = first.rpartition(":")
        return cls((host or "127.0.0.1", int(port)))

    def url(self, url: str) -> str:
        """``url`` with its server replaced by this proxy (credentials and options kept)."""
        parts = urlsplit(url)
        userinfo, at, _ = parts.netloc.rpartition("@")
        return urlunsplit(parts._replace(netloc=f"{userinfo}{at}127.0.0.1:{self.port}"))

    # -- the faults ------------------------------------------------------------------

    def delay(self, seconds: float, direction: Direction = "both") -> None:
        """Deliver every chunk read from now on ``seconds`` after it came, in
        ``direction``; a round trip then takes twice ``seconds`` ("both") or once."""
        with self._state:
            for way in ("requests", "answers"):
                if direction in ("both", way):
                    self._delays[way] = seconds

    def freeze(self, on: bool = True) -> None:
        """Stop forwarding, both ways, keeping every connection open; new connections
        are accepted and connected upstream, their bytes held too. Off: all flows."""
        self._switch(frozen=on)

    def blackhole(self, on: bool = True) -> None:
        """Drop every byte, both ways, keeping all connections open: a close is not
        passed on either while on. New connections are accepted, and stay silent."""
        self._switch(blackholed=on)

    def reset(self, on: bool = True) -> None:
        """Reset (RST) every open connection at once and, while on, every new one."""
        self._switch(resetting=on)
        if on:
            self.drop_connections()

    def trickle(self, gap: float | None) -> None:
        """Answers reach the client one byte every ``gap`` seconds (``None``: at once)."""
        self._switch(gap=gap)

    def drop_connections(self) -> None:
        """Reset (RST) every open connection now, as a network that comes back after
        a long cut finds both ends' state gone; new connections are welcome."""
        with self._state:
            self._drops += 1
            links = list(self._links)
        for link in links:
            link.cut(reset=True)

    def heal(self) -> None:
        """Back to a plain, fast forwarder: held bytes flow, dropped ones stay lost,
        connections reset meanwhile stay gone."""
        with self._state:
            self._delays = dict.fromkeys(self._delays, 0.0)
        self._switch(frozen=False, blackholed=False, resetting=False, gap=None)

    def _switch(self, **switches: object) -> None:
        with self._state:
            for name, value in switches.items():
                setattr(self, f"_{name}", value)
            self._state.notify_all()

    # -- machinery -------------------------------------------------------------------

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._state:
                closing, resetting, drops = self._closing, self._resetting, self._drops
            if closing:  # the wake-up call of close()
                client.close()
                return
            if resetting:
                _abort(client)
                continue
            try:
                server = socket.create_connection(self.upstream, timeout=_JOIN)
            except OSError:
                _abort(client)  # as a server that is down: refused
                continue
            server.settimeout(None)
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            link = _Link(self, client, server)
            with self._state:
                dropped = self._drops != drops or self._resetting
                if not dropped:
                    self._links.add(link)
            if dropped:  # while it was being connected upstream
                _abort(client)
                _abort(server)
                continue
            link.start()

    def _admit(self, link: _Link, data: bytes) -> bool:
        """Wait out a freeze (and a blackhole, for a close); whether ``data`` is to be
        forwarded (a blackhole drops it)."""
        with self._state:
            while (self._frozen or (self._blackholed and not data)) and not link.is_cut():
                self._state.wait()
            return not self._blackholed or not data

    def _delay_of(self, direction: str) -> float:
        return self._delays[direction]

    def _gap_now(self) -> float | None:
        return self._gap

    def _ended(self, link: _Link) -> None:
        with self._state:
            self._links.discard(link)

    def _wake(self) -> None:
        with self._state:
            self._state.notify_all()

    def close(self) -> None:
        """Stop listening, end every connection (FIN) and join every thread."""
        with self._state:
            if self._closing:
                return
            self._closing = True
        try:  # accept() is woken by a connection, everywhere
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
        except OSError:
            pass
        self._acceptor.join(_JOIN)
        self._listener.close()
        with self._state:
            links = list(self._links)
        for link in links:
            link.cut(reset=False)
        for link in links:
            link.join()

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class _Link:
    """One client connection and its connection upstream: a reader and a sender
    thread each way. The last thread out closes both sockets, so that no thread ever
    uses a closed (and perhaps reused) descriptor; cutting the link only shuts them
    down, which wakes every thread blocked on them."""

    def __init__(self, proxy: TcpProxy, client: socket.socket, server: socket.socket) -> None:
        self._proxy = proxy
        self._sockets = (client, server)
        self._cut = threading.Event()
        self._lock = threading.Lock()
        self._eofs = 0
        self._threads: list[threading.Thread] = []
        for source, sink, direction in ((client, server, "requests"), (server, client, "answers")):
            chunks: queue.SimpleQueue[tuple[float, bytes]] = queue.SimpleQueue()
            self._threads += [
                threading.Thread(target=self._read, args=(source, direction, chunks), daemon=True),
                threading.Thread(target=self._send, args=(sink, direction, chunks), daemon=True),
            ]
        self._running = len(self._threads)

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def is_cut(self) -> bool:
        return self._cut.is_set()

    def cut(self, *, reset: bool) -> None:
        """End the connection both ways: with RST (``reset``) or FIN."""
        self._cut.set()
        for sock in self._sockets:
            try:
                if reset:  # no FIN: SO_LINGER 0 makes the close send RST
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    sock.shutdown(socket.SHUT_RD)
                else:
                    sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._proxy._wake()

    def join(self) -> None:
        for thread in self._threads:
            thread.join(_JOIN)

    def _read(
        self,
        source: socket.socket,
        direction: str,
        chunks: queue.SimpleQueue[tuple[float, bytes]],
    ) -> None:
        try:
            while True:
                try:
                    data = source.recv(_CHUNK)
                except OSError:
                    data = b""
                if data and direction == "requests":
                    self._proxy.sent += data
                chunks.put((time.monotonic() + self._proxy._delay_of(direction), data))
                if not data:
                    return
        finally:
            self._exit()

    def _send(
        self,
        sink: socket.socket,
        direction: str,
        chunks: queue.SimpleQueue[tuple[float, bytes]],
    ) -> None:
        try:
            while True:
                due, data = chunks.get()
                pause = due - time.monotonic()
                if pause > 0 and self._cut.wait(pause):
                    return
                if not self._proxy._admit(self, data):
                    continue
                if self._cut.is_set():
                    return
                if not data:
                    self._eof(sink)
                    return
                self._forward(sink, direction, data)
        except OSError:
            self.cut(reset=False)
        finally:
            self._exit()

    def _forward(self, sink: socket.socket, direction: str, data: bytes) -> None:
        if direction == "requests" or self._proxy._gap_now() is None:
            sink.sendall(data)
            return
        for at in range(len(data)):
            gap = self._proxy._gap_now()
            if gap is None:
                sink.sendall(data[at:])
                return
            if self._cut.wait(gap):
                return
            sink.sendall(data[at : at + 1])

    def _eof(self, sink: socket.socket) -> None:
        """Pass a close on (half-close); once both ways are closed, the link ends."""
        try:
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        with self._lock:
            self._eofs += 1
            both = self._eofs == 2
        if both:
            self.cut(reset=False)

    def _exit(self) -> None:
        with self._lock:
            self._running -= 1
            last = self._running == 0
        if last:
            for sock in self._sockets:
                sock.close()
            self._proxy._ended(self)


def _abort(sock: socket.socket) -> None:
    """Close with RST rather than FIN."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    sock.close()
