"""HTTP/1.1 to one etcd member with h11: the source of both APIs' connections.

The sync twin in ``_sync/`` is generated from this module by ``scripts/async_to_sync.py``.

h11 (python-hyper's sans-I/O HTTP/1.1, the protocol layer under httpcore) parses and
frames; this module only moves its bytes over a stream of ``_streams``. A connection
serves one request at a time and is kept for the next; any failure closes it, so that
no half-read answer is left for the next request. A request is one exchange of its
stream: the bytes h11 frames, then h11 fed what comes until the answer is complete.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import AsyncIterator

import h11

from .._streams import AsyncStream, Done, async_open

__all__ = ["IDLE", "AsyncConnection", "Closed"]

IDLE = 0.5
"""Seconds after which a kept connection is checked for the member's end before use
(a look costs a system call; calls in a row skip it)."""


_MADE = 64  # requests kept per connection for their target and body length
_END = h11.EndOfMessage()


class Closed(EOFError):
    """The member closed the connection before its answer was complete."""


class AsyncConnection:
    """A kept-alive HTTP/1.1 connection to one member."""

    __slots__ = ("_chunks", "_h11", "_host", "_made", "_status", "_stream", "_used")

    def __init__(self, stream: AsyncStream, host: bytes) -> None:
        self._stream = stream
        self._host = (b"Host", host)
        self._h11 = h11.Connection(h11.CLIENT)
        self._used = time.monotonic()
        self._status = 0
        self._chunks: list[bytes] = []
        self._made: dict[tuple[bytes, int], tuple[object, h11.Request]] = {}

    @classmethod
    async def open(
        cls, host: str, port: int, context: ssl.SSLContext | None, within: float
    ) -> AsyncConnection:
        """Connect to the member at ``host:port`` (TLS with ``context``) ``within`` seconds."""
        stream = await async_open(host, port, context, within)
        return cls(stream, f"{host}:{port}".encode())

    def reusable(self) -> bool:
        """Whether the connection may serve another request: open, and -- if it has
        been idle for :data:`IDLE` seconds -- not closed by the member meanwhile."""
        if self._h11.our_state is not h11.IDLE:
            return False
        return time.monotonic() - self._used < IDLE or not self._stream.closed_by_peer()

    def _request(self, target: bytes, headers: list[tuple[bytes, bytes]], body: bytes) -> bytes:
        """The bytes of a POST of ``body`` to ``target``."""
        # h11 checks every header of a Request it is given: one made per target and body
        # length (and the same headers) is sent again, as events are plain values.
        key = (target, len(body))
        made = self._made.get(key)
        if made is None or made[0] is not headers:
            if len(self._made) >= _MADE:
                self._made.clear()
            length = (b"Content-Length", b"%d" % len(body))
            request = h11.Request(
                method=b"POST", target=target, headers=[self._host, length, *headers]
            )
            made = self._made[key] = (headers, request)
        send = self._h11.send
        head = send(made[1]) or b""
        return head + (send(h11.Data(data=body)) or b"") + (send(_END) or b"")

    def _answer(self, data: bytes) -> tuple[int, bytes] | None:
        """Feed ``data`` (``b""``: the member closed the connection) to the parser: the
        status and the whole body once the answer is complete, else ``None``."""
        connection = self._h11
        if not data and connection.their_state is not h11.DONE:
            raise Closed("the member closed the connection")
        connection.receive_data(data)
        while True:
            event = connection.next_event()
            if event is h11.NEED_DATA:
                return None
            if type(event) is h11.Data:
                self._chunks.append(bytes(event.data))
            elif type(event) is h11.Response:
                self._status = event.status_code
            elif type(event) is h11.EndOfMessage:
                break
        connection.start_next_cycle()
        self._used = time.monotonic()
        chunks, self._chunks = self._chunks, []
        return self._status, chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def _event(self) -> h11.Event | type[h11.PAUSED]:
        while True:
            event = self._h11.next_event()
            if event is not h11.NEED_DATA:
                return event  # type: ignore[return-value]
            data = await self._stream.receive()
            if not data and self._h11.their_state is not h11.DONE:
                raise Closed("the member closed the connection")
            self._h11.receive_data(data)

    async def request(
        self, target: bytes, headers: list[tuple[bytes, bytes]], body: bytes, within: float
    ) -> tuple[int, bytes]:
        """POST ``body`` to ``target``; the status and the whole body of the answer,
        within ``within`` seconds in all."""
        data = self._request(target, headers, body)
        return await self._stream.exchange(data, self._answer, within)

    # async-only: the started path (see AsyncGateway.start)
    def start(
        self,
        target: bytes,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        within: float,
        done: Done[tuple[int, bytes]],
    ) -> None:
        """:meth:`request`, started: ``done`` gets the answer or the error (see
        :meth:`AsyncStream.start`)."""
        self._stream.start(self._request(target, headers, body), self._answer, within, done)

    async def stream(
        self, target: bytes, headers: list[tuple[bytes, bytes]], body: bytes, idle: float
    ) -> AsyncIterator[bytes]:
        """POST ``body`` to a streaming ``target``; yield the status (as bytes of digits)
        first, then each piece of the answer as it comes. A receive waits at most
        ``idle`` seconds (on the sync side; the async caller bounds it itself)."""
        self._stream.set_timeout(idle)
        await self._stream.send(self._request(target, headers, body))
        while True:
            event = await self._event()
            if isinstance(event, h11.Response):
                yield b"%d" % event.status_code
            elif isinstance(event, h11.Data):
                yield bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                return

    # async-only: a sync close, for the started path's callbacks
    def abort(self) -> None:
        """Cut the connection at once."""
        self._stream.abort()

    async def aclose(self) -> None:
        """Close the connection."""
        await self._stream.aclose()
