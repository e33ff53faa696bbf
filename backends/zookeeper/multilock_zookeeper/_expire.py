"""Ending a session from outside, as the server does when it expires one (the
conformance hook that breaks a lease, and the tests of how fast ``lost`` fires).

The way kazoo's own tests do it -- a second client started on the session, then
stopped -- races the session's own client: the server closes the first connection
when the second attaches, the first client reconnects at once and takes the
session back, and the second client's stop may then find no connection to send its
close on. Here the attach and the close go in one write, so that the server has
closed the session before its client is back.
"""

from __future__ import annotations

import socket
import struct

from kazoo.protocol.serialization import Close, Connect

from ._config import DEFAULT_PORT, Config
from ._tls import tls_connect

__all__ = ["end_session"]

_INT = struct.Struct("!i")


def end_session(config: Config, client_id: tuple[int, bytes]) -> None:
    """Close the session ``client_id`` (kazoo's ``(session id, password)``) on the first
    server of ``config``'s ensemble that answers; ``OSError`` when none does."""
    session_id, password = client_id
    timeout_ms = int(config.session_timeout * 1000)
    connect = bytes(Connect(0, 0, timeout_ms, session_id, password, False).serialize())
    close = _INT.pack(1) + _INT.pack(Close.type)  # xid 1, closeSession
    packets = b"".join(_INT.pack(len(body)) + body for body in (connect, close))
    error: OSError = ConnectionRefusedError("no server of the ensemble answered")
    for host, port in config.url.hosts:
        try:
            with _connect(config, (host, port or DEFAULT_PORT)) as sock:
                sock.sendall(packets)
                # The server answers both, then closes the connection: wait for that.
                while sock.recv(4096):
                    pass
            return
        except OSError as exc:
            error = exc
    raise error


def _connect(config: Config, address: tuple[str, int]) -> socket.socket:
    if config.tls is None:
        return socket.create_connection(address, config.connect_timeout)
    return tls_connect(config.tls.context, address, address[0], config.connect_timeout)
