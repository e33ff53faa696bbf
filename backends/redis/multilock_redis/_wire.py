"""What a locker's own connection needs: the RESP encoding of a command, and its gate.

The generated sync code turns ``AsyncGate`` into ``SyncGate``; both are
non-blocking, so a call that finds the connection busy goes through the client's
pool instead of queueing behind a call that may be waiting out a socket timeout.
"""

from __future__ import annotations

import threading

__all__ = ["AsyncGate", "SyncGate", "pack"]


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
