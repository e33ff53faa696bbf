"""A TCP proxy the reliability tests put between a locker and its server, to inject
the network faults users fear: a slow link (``delay``), a link that silently drops
everything while the connections stay open (``blackhole``) and a peer that resets
every connection (``reset``).

It runs its own asyncio loop in a daemon thread, so sync and async lockers alike can
talk through it; the fault switches are thread-safe.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
from types import TracebackType
from urllib.parse import urlsplit, urlunsplit

__all__ = ["FaultProxy"]

_CHUNK = 65536


class FaultProxy:
    """Forwards 127.0.0.1:``port`` to ``(host, target_port)`` until told otherwise."""

    def __init__(self, host: str, target_port: int) -> None:
        self._target = (host, target_port)
        self._delay = 0.0
        self._blackhole = False
        self._resetting = False
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._run, name="fault-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the fault proxy did not start")
        self.port: int = self._listening().sockets[0].getsockname()[1]

    @classmethod
    def before(cls, url: str) -> FaultProxy:
        """A proxy in front of the (first) server of lock URL ``url``."""
        parts = urlsplit(url)
        first = parts.netloc.rsplit("@", 1)[-1].split(",")[0]
        host, _, port = first.rpartition(":")
        return cls(host or "127.0.0.1", int(port))

    def url(self, url: str) -> str:
        """``url`` with its server replaced by this proxy (credentials and options kept)."""
        parts = urlsplit(url)
        userinfo, at, _ = parts.netloc.rpartition("@")
        netloc = f"{userinfo}{at}127.0.0.1:{self.port}"
        return urlunsplit(parts._replace(netloc=netloc))

    # -- the faults ------------------------------------------------------------------

    def delay(self, seconds: float) -> None:
        """Hold every chunk, in each direction, ``seconds`` before forwarding it."""
        self._delay = seconds

    def blackhole(self, on: bool = True) -> None:
        """Drop every byte, both ways, keeping all connections open; new connections
        are accepted (the proxy's kernel answers) but never reach the server."""
        self._blackhole = on
        self._loop.call_soon_threadsafe(self._open.clear if on else self._open.set)

    def reset(self, on: bool = True) -> None:
        """Reset (RST) every open connection at once and, while on, every new one."""
        self._resetting = on
        if on:
            self._loop.call_soon_threadsafe(self._reset_all)

    def heal(self) -> None:
        """Back to a plain, fast forwarder (connections reset meanwhile stay gone)."""
        self._delay = 0.0
        self._blackhole = False
        self._resetting = False
        self._loop.call_soon_threadsafe(self._open.set)

    def drop_connections(self) -> None:
        """Close every connection now, as a network that comes back after a long cut
        finds both ends' state gone."""
        self._loop.call_soon_threadsafe(self._reset_all)

    # -- machinery -------------------------------------------------------------------

    def _listening(self) -> asyncio.Server:
        assert self._server is not None, "the fault proxy's loop set no server"
        return self._server

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._open = asyncio.Event()  # cleared while blackholed
        self._open.set()
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", 0)
        )
        self._ready.set()
        self._loop.run_forever()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._resetting:
            _abort(writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            _abort(writer)
            return
        self._writers |= {writer, up_writer}
        await asyncio.gather(
            self._pump(reader, up_writer, writer), self._pump(up_reader, writer, up_writer)
        )

    async def _pump(
        self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, mine: asyncio.StreamWriter
    ) -> None:
        try:
            while data := await source.read(_CHUNK):
                if self._delay:
                    await asyncio.sleep(self._delay)
                if self._blackhole:
                    continue  # vanished on the wire; the sender's kernel thinks it arrived
                sink.write(data)
                await sink.drain()
        except OSError:
            pass
        # A blackhole loses the FIN too: the peer must not learn that the other end left.
        if not sink.is_closing():
            await self._open.wait()
        for end in (sink, mine):
            self._writers.discard(end)
            end.close()

    def _reset_all(self) -> None:
        for writer in list(self._writers):
            _abort(writer)
        self._writers.clear()

    def close(self) -> None:
        """Reset every connection, stop listening and stop the thread."""

        async def shut() -> None:
            self._reset_all()
            if self._server is not None:
                self._server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        if self._loop.is_running():
            asyncio.run_coroutine_threadsafe(shut(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close with RST rather than FIN: SO_LINGER 0, then drop the socket."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    writer.transport.abort()
