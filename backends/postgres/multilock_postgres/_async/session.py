"""Opening and setting up a locker's session: its timeouts, its server process, the
fencing sequence, and the check that no transaction pooler stands in between.

A session advisory lock belongs to one server session. A pooler that hands each
transaction to whichever server session is free (PgBouncer's ``pool_mode =
transaction`` or ``statement``) would take a lock on one server session and check or
release it on another, while other clients' transactions run on the session that
holds it, and "hold" it too. Such a pooler cannot be asked which mode it runs in, so
the set-up watches what it does: when the server does not see our end of the
connection as ours (a proxy, or a Unix socket, where it cannot be told), the session
asks for its server process id again, and a second connection asks for its own. A
pooling proxy shows itself by answering the session's two questions from different
server processes, or the second connection from the session's: a pooler hands an idle
client's server session to the next transaction (PgBouncer reuses the most recently
freed one first, or rotates through them with ``server_round_robin``). A
session-mode pool gives each client its own server session for its whole life, so it
passes; a direct TCP connection pays nothing for the check. A second connection that
gets no answer (a session pool with no server session to spare) leaves only the first
test: a warning says so, and the session goes on.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
from collections.abc import Sequence
from typing import Any

import psycopg

from multilock.errors import BackendUnavailable, ConfigurationError

from .. import _sql
from .._config import Settings, milliseconds
from .._errors import check_sequence, driver_error, fencing_error
from .._runtime import AsyncDeadline, Cut

__all__ = ["answer", "open_connection", "prepare_session", "timeouts"]

_log = logging.getLogger("multilock.postgres")


async def open_connection(settings: Settings) -> psycopg.AsyncConnection[Any]:
    """A new connection to the server (within ``connect_timeout``)."""
    try:
        return await psycopg.AsyncConnection.connect(settings.conninfo, **settings.connect_kwargs())
    except psycopg.Error as exc:
        raise driver_error(settings.url, exc, "connecting") from None


async def prepare_session(
    conn: psycopg.AsyncConnection[Any], settings: Settings
) -> tuple[int, tuple[str, str] | None]:
    """Set the session's timeouts and learn its server process id (one round trip),
    refuse a transaction pooler, then find (or make) and check the fencing sequence.
    The server process id, and the sequence's schema and name. Each round trip is
    bounded (see :func:`answer`)."""
    doing = "setting the session's timeouts"
    try:
        cursor = await answer(conn, settings, doing, _sql.SET_UP, timeouts(settings))
        row = await cursor.fetchone()
    except psycopg.Error as exc:
        raise driver_error(settings.url, exc, doing) from None
    assert row is not None
    pid, client_addr, client_port = row[2:]
    if not _direct(conn, client_addr, client_port):
        await _refuse_transaction_pooling(conn, settings, pid)
    sequence = settings.fencing_sequence
    if sequence is None:
        return pid, None
    doing = f"preparing the fencing sequence {sequence!r}"
    try:
        look, create = _sql.ensure_sequence(sequence)
        row = await (await answer(conn, settings, doing, look)).fetchone()
        if row is None:
            try:
                await answer(conn, settings, doing, create)
            except (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateTable):
                # Made by another session meanwhile: IF NOT EXISTS does not see a
                # creation not yet committed, and then waits for it and fails.
                pass
            row = await (await answer(conn, settings, doing, look)).fetchone()
        return pid, check_sequence(settings.url, sequence, row)
    except psycopg.Error as exc:
        raise fencing_error(settings.url, sequence, exc) from None


async def answer(
    conn: psycopg.AsyncConnection[Any],
    settings: Settings,
    doing: str,
    query: Any,
    params: Sequence[Any] | None = None,
) -> psycopg.AsyncCursor[Any]:
    """``conn.execute`` on a connection other than a set-up session (being set up, or
    one of its own), whose socket is cut if it gets no answer within ``health_timeout``
    -- then ``BackendUnavailable`` saying so. Other errors are psycopg's."""
    cut = Cut(conn, settings.health_timeout)
    with AsyncDeadline(cut.seconds, cut):
        try:
            return await conn.execute(query, params)
        except psycopg.Error as exc:
            if cut.done:
                raise driver_error(settings.url, exc, doing, cut.seconds) from None
            raise


def timeouts(settings: Settings) -> tuple[str, str]:
    """The parameters of ``_sql.SET_TIMEOUTS`` (and ``_sql.SET_UP``)."""
    lock, statement = settings.lock_timeout, settings.statement_timeout
    return f"{milliseconds(lock)}ms", f"{milliseconds(statement)}ms"


def _direct(conn: psycopg.AsyncConnection[Any], client_addr: str | None, port: int | None) -> bool:
    """Whether the server sees our end of the TCP connection as it is: no proxy between.
    ``False`` when it cannot tell (a Unix socket: the server sees no address)."""
    if client_addr is None or port is None:
        return False
    try:
        with socket.socket(fileno=os.dup(conn.pgconn.socket)) as sock:
            local = sock.getsockname()
    except (OSError, psycopg.Error):
        return False
    if not isinstance(local, tuple):
        return False
    return bool(_same_address(local[0], client_addr) and local[1] == port)


def _same_address(ours: str, theirs: str) -> bool:
    mine, seen = ipaddress.ip_address(ours), ipaddress.ip_address(theirs)
    # A dual-stack socket shows an IPv4 peer as ::ffff:a.b.c.d.
    if isinstance(mine, ipaddress.IPv6Address) and mine.ipv4_mapped is not None:
        mine = mine.ipv4_mapped
    if isinstance(seen, ipaddress.IPv6Address) and seen.ipv4_mapped is not None:
        seen = seen.ipv4_mapped
    return mine == seen


async def _refuse_transaction_pooling(
    conn: psycopg.AsyncConnection[Any], settings: Settings, first: int
) -> None:
    """Raise :class:`ConfigurationError` if a pooler shares server sessions between
    clients (see the module's docstring); ``first``: the session's server process id."""
    doing = "checking for a transaction pooler"
    second = await _server_pid(conn, settings, doing)
    third: int | None = None
    try:
        other = await open_connection(settings)
        try:
            third = await _server_pid(other, settings, doing)
        finally:
            await other.close()
    except BackendUnavailable as exc:
        _log.warning(
            "%s: a second connection, to check that no transaction pooler shares server"
            " sessions, got no answer; checked with one connection only: %s",
            settings.url.masked,
            exc,
        )
    if second == first and third not in (first, second):
        return
    raise ConfigurationError(
        f"PostgreSQL at {settings.url.masked}: the connection goes through a pooler that"
        " shares server sessions between clients (PgBouncer with pool_mode = transaction"
        " or statement, or a proxy like it): a session advisory lock would be held by a"
        " server session that other clients' transactions run on. Connect to PostgreSQL"
        " directly, or through a pool in session mode (PgBouncer: pool_mode = session)"
    )


async def _server_pid(conn: psycopg.AsyncConnection[Any], settings: Settings, doing: str) -> int:
    try:
        row = await (await answer(conn, settings, doing, _sql.SERVER_PID)).fetchone()
    except psycopg.Error as exc:
        raise driver_error(settings.url, exc, doing) from None
    assert row is not None
    return int(row[0])
