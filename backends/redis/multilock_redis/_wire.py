"""What a locker's own connection needs: the RESP encoding of a command, its gate, its socket.

The generated sync code turns ``AsyncGate`` and ``AsyncSocket`` into ``SyncGate``
and ``SyncSocket``. Gates never block: a call that finds the connection busy goes
through the client's pool instead of queueing behind a call that may be waiting
out a socket timeout.
"""

from __future__ import annotations

import asyncio
import threading
from contextlib import AbstractAsyncContextManager, nullcontext
from typing import Any

__all__ = ["AsyncGate", "AsyncSocket", "SyncGate", "SyncSocket", "pack", "wait_time_ms"]


def pack(args: tuple[str | int, ...]) -> bytes:
    """``args`` as one RESP command (an array of bulk strings), ready to send.

    Not redis-py's packer: it encodes each argument through a general encoder and
    grows its buffer piece by piece, which costs about 11 µs for an acquire and
    4 ms for a thousand-name batch; this costs 3 µs and 0.6 ms. Our arguments are
    only ``str`` (UTF-8: lock names are checked to encode) and ``int``.
    """
    encoded = [arg.encode() if isinstance(arg, str) else b"%d" % arg for arg in args]
    return b"*%d\r\n" % len(encoded) + b"".join(
        [b"$%d\r\n%b\r\n" % (len(arg), arg) for arg in encoded]
    )


def wait_time_ms(timeout: float, socket_timeout: float | None) -> int:
    """``WAIT``'s timeout in milliseconds: ``timeout``, but within half the socket
    timeout, so that its answer comes before the socket gives up (and never 0,
    which would wait forever)."""
    if socket_timeout is not None:
        timeout = min(timeout, socket_timeout / 2)
    return max(1, round(timeout * 1000))


class AsyncGate:
    """Lets one task at a time use a connection; the others are turned away, not queued.

    A flag is enough: nothing runs between the check and the set in one event loop.
    """

    __slots__ = ("_busy",)

    def __init__(self) -> None:
        self._busy = False

    def enter(self) -> bool:
        """Take the connection; ``False`` (and nothing taken) when it is in use."""
        if self._busy:
            return False
        self._busy = True
        return True

    def leave(self) -> None:
        """Give the connection back."""
        self._busy = False


class SyncGate:
    """:class:`AsyncGate` for threads."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def enter(self) -> bool:
        """Take the connection; ``False`` (and nothing taken) when it is in use."""
        return self._lock.acquire(blocking=False)

    def leave(self) -> None:
        """Give the connection back."""
        self._lock.release()


class AsyncSocket:
    """A connection of the client's pool's kind and options (not counted by the pool),
    and the deadline of one call on it.

    The connection itself has no socket timeout: with one, redis-py wraps every
    send in ``asyncio.wait_for``, a task of its own each time. One
    ``asyncio.timeout`` around the whole call (connect, send, reply) bounds it
    instead, at the client's socket timeout; redis-py disconnects the connection
    when that cancels it.
    """

    __slots__ = ("connection", "timeout")

    def __init__(self, pool: Any) -> None:
        kwargs = pool.connection_kwargs
        self.timeout: float | None = kwargs.get("socket_timeout")
        self.connection: Any = pool.connection_class(**{**kwargs, "socket_timeout": None})

    def deadline(self) -> AbstractAsyncContextManager[Any]:
        """The bound of one call: a ``TimeoutError`` when it passes."""
        return asyncio.timeout(self.timeout)

    async def readable(self) -> bool:
        """Whether the connection has something to read: before a call, that the
        server closed it (or sent what nobody asked for). redis-py 8 names the check
        ``can_read()``; before 8 the asyncio connection had only
        ``can_read_destructive()`` (deprecated in 8), which answers the end of the
        stream with ``b""``, falsy: only its ``False`` means nothing to read."""
        if hasattr(self.connection, "can_read"):
            readable: bool = await self.connection.can_read()
            return readable
        return await self.connection.can_read_destructive() is not False

    def closed(self) -> bool:
        """Whether the connection must be opened before a call, through
        ``connect()``: a Sentinel-managed connection asks the Sentinels where the
        primary is there, which a send on a closed connection skips (it would dial
        redis-py's default, localhost:6379). Not a coroutine: it is asked on every
        call."""
        return not self.connection.is_connected


class SyncSocket:
    """:class:`AsyncSocket` for threads: the connection's own socket timeout bounds a call."""

    __slots__ = ("connection", "timeout")

    def __init__(self, pool: Any) -> None:
        kwargs = pool.connection_kwargs
        self.timeout: float | None = kwargs.get("socket_timeout")
        # Made as AsyncSocket makes its own, outside the pool's count: max_connections
        # bounds the pool, which serves the calls that find this connection busy.
        self.connection: Any = pool.connection_class(**kwargs)

    def deadline(self) -> nullcontext[None]:
        """Nothing to add: every socket operation has its timeout."""
        return nullcontext()

    def readable(self) -> bool:
        """:meth:`AsyncSocket.readable` (every redis-py names it ``can_read()``)."""
        readable: bool = self.connection.can_read()
        return readable

    def closed(self) -> bool:
        """:meth:`AsyncSocket.closed`."""
        return self.connection._sock is None  # is_connected is not in every redis-py 5
