"""Running the Lua scripts: ``EVALSHA``, and loading a script the server lacks.

A locker runs them on a connection of its own (its link, below), not through
the client's ``execute_command``: that takes a connection from the pool and
gives it back, and records metrics, on every call -- about 40 µs of Python per
command on the development machine, more than the rest of a lock cycle. Nor
through redis-py's ``Script`` objects: their call costs about ten microseconds
more again.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterable
from typing import Any

from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .._config import AsyncClient, sentinels_of
from .._errors import REDIS_ERRORS
from .._scripts import Lua
from .._wire import AsyncGate, AsyncSocket, pack, wait_time_ms

__all__ = ["AsyncLink", "Request", "reloading", "run"]

Execute = Callable[..., Any]  # execute_command, or a link's own
Request = tuple[list[str], list[str | int]]  # a script call's keys and arguments
IDLE = 0.5
"""Seconds after which a link checks its connection is still open before using it."""


async def run(client: AsyncClient, script: Lua, keys: list[str], args: list[str | int]) -> Any:
    """Run ``script`` through ``client`` (a connection from its pool)."""
    # The bare execute_command, not evalsha(): its typed dispatch costs a microsecond.
    return await _evalsha(client.execute_command, script, keys, args)


async def reloading(send: Callable[[], Any], load: Callable[[], Any]) -> tuple[list[Any], int]:
    """The answers and acknowledgements of ``send()`` (a waited pipeline); if the
    server lacked the script for every request, ``load()`` it and send again. Had
    some requests run and others not, nothing can vouch for those that did: -1
    acknowledged (the answers kept as they are)."""
    answers, acked = await send()
    lacking = [isinstance(answer, NoScriptError) for answer in answers]
    if not any(lacking):
        return answers, acked
    if not all(lacking):
        return answers, -1
    await load()
    result: tuple[list[Any], int] = await send()
    return result


async def _evalsha(execute: Execute, script: Lua, keys: list[str], args: list[str | int]) -> Any:
    """``EVALSHA`` the script; on ``NOSCRIPT`` (after a restart, a failover or a
    ``SCRIPT FLUSH``), load it and run it again: it did not run the first time."""
    try:
        return await execute("EVALSHA", script.sha, len(keys), *keys, *args)
    except NoScriptError:
        await execute("SCRIPT", "LOAD", script.source)
        return await execute("EVALSHA", script.sha, len(keys), *keys, *args)


class AsyncLink:
    """A locker's way to Redis: a connection of its own, the client's pool when it is busy.

    The connection is redis-py's, of the client's pool's kind and options (TLS,
    password, unix socket, db, no retries) but never returned to it; each call on
    it is bounded by the client's socket timeout (see :class:`AsyncSocket`).
    redis-py disconnects it on any error, timeout or cancellation of a call, so
    that a failed call leaves no reply behind for the next one; the next call
    connects again. A call that finds it in use (another thread, or a task
    awaiting its reply) takes a pool connection rather than wait: waits would add
    up past the socket timeout. So does every call after a fork, whose child must
    not share the parent's socket.

    A connection idle for :data:`IDLE` seconds may have been closed by the server
    (its ``timeout``, ``CLIENT KILL``) or by a proxy: like redis-py's pool before
    it reuses a connection, the link then looks for its end first, and connects
    afresh instead of failing the call. Calls in a row skip that look.
    """

    __slots__ = ("_answered", "_client", "_gate", "_pid", "_socket")

    def __init__(self, client: AsyncClient) -> None:
        self._client = client
        self._socket = AsyncSocket(client.connection_pool)
        self._gate = AsyncGate()
        self._pid = os.getpid()
        # When the connection last answered; None while it is not known to be open.
        self._answered: float | None = None

    @property
    def client(self) -> AsyncClient:
        """The redis-py client whose pool the link draws on (for a pub/sub connection)."""
        return self._client

    # async-only: the started path (see _started.py)
    @property
    def timeout(self) -> float | None:
        """The bound of one call on the link's connection: the client's socket timeout."""
        return self._socket.timeout

    # async-only: the started path (see _started.py)
    def idle_transport(self) -> asyncio.Transport | None:
        """The open connection's transport, with the link taken, for a call written at
        once; ``None``, with nothing taken, when the call must take the task path: the
        link busy, in a forked child, its connection closed, ended by the server or
        holding what nobody asked for, or health checks asked for (they need a task)."""
        connection = self._socket.connection
        # redis-py's stream pair; asyncio's buffer, as redis-py reads it for can_read.
        reader: Any = getattr(connection, "_reader", None)
        writer: Any = getattr(connection, "_writer", None)
        unread: Any = getattr(reader, "_buffer", True)
        if (
            reader is None
            or writer is None
            or getattr(connection, "health_check_interval", True)
            or unread
            or reader.at_eof()
            or reader.exception() is not None
            or writer.transport.is_closing()
            or self._pid != os.getpid()
            or not self._gate.enter()
        ):
            return None
        self._answered = None
        transport: asyncio.Transport = writer.transport
        return transport

    # async-only: the started path
    def answered(self) -> None:
        """A started call's answer is in: the link is free again."""
        self._answered = time.monotonic()
        self._gate.leave()

    # async-only: the started path
    async def failed(self, broken: bool) -> None:
        """A started call failed: the link is free again, its connection dropped first
        if ``broken`` (what is on it is unknown), as redis-py drops it."""
        try:
            if broken:
                await self._socket.connection.disconnect(nowait=True)
        finally:
            self._gate.leave()

    async def run(self, script: Lua, keys: list[str], args: list[str | int]) -> Any:
        """Run ``script`` on ``keys`` with ``args``; its reply as redis-py parses it."""
        if self._pid != os.getpid() or not self._gate.enter():
            return await run(self._client, script, keys, args)
        try:
            return await _evalsha(self._execute, script, keys, args)
        finally:
            self._gate.leave()

    async def run_pipelined(
        self, script: Lua, requests: Iterable[Request], answered: Callable[[int, Any], None]
    ) -> None:
        """Run ``script`` once per request, every request sent before any answer is
        read, and hand each answer to ``answered(i, answer)`` as it is read.

        One round trip's worth of latency for them all, as for one call, but the
        work overlaps: the server runs request k while the client makes request
        k+1 (``requests`` is consumed as it is sent) or takes in answer k-1. An
        error answer does not stop the others; the first is raised once every
        answer is in (``answered`` has been given the others).
        """
        if self._pid != os.getpid() or not self._gate.enter():
            for i, (keys, args) in enumerate(requests):
                answered(i, await run(self._client, script, keys, args))
            return
        try:
            missing = await self._pipelined(script, requests, answered)
            if missing:  # NOSCRIPT: those did not run
                await self._execute("SCRIPT", "LOAD", script.source)
                for i, (keys, args) in missing:
                    answered(i, await self._execute("EVALSHA", script.sha, len(keys), *keys, *args))
        finally:
            self._gate.leave()

    async def _pipelined(
        self, script: Lua, requests: Iterable[Request], answered: Callable[[int, Any], None]
    ) -> list[tuple[int, Request]]:
        """:meth:`run_pipelined` on the link's connection; the requests the server
        had no script for, to run again."""
        connection = self._socket.connection
        answered_at, self._answered = self._answered, None
        sent: list[Request] = []
        missing: list[tuple[int, Request]] = []
        failed: BaseException | None = None
        try:
            async with self._socket.deadline():
                if answered_at is not None and time.monotonic() - answered_at > IDLE:
                    await _drop_if_closed(self._socket)
                if self._socket.closed():
                    await connection.connect()
                for keys, args in requests:
                    command = pack(("EVALSHA", script.sha, len(keys), *keys, *args))
                    await connection.send_packed_command([command])
                    sent.append((keys, args))
                for i, request in enumerate(sent):
                    try:
                        answer = await connection.read_response()
                    except NoScriptError:
                        missing.append((i, request))
                    except ResponseError as exc:  # the answers after it are still to read
                        failed = failed or exc
                    else:
                        try:
                            answered(i, answer)
                        except Exception as exc:  # as above: the answers are still to read
                            failed = failed or exc
        except TimeoutError:
            raise RedisTimeoutError(f"no answer within {self._socket.timeout}s") from None
        self._answered = time.monotonic()
        if failed is not None:
            raise failed
        return missing

    async def _execute(self, *args: str | int) -> Any:
        connection = self._socket.connection
        answered, self._answered = self._answered, None
        try:
            async with self._socket.deadline():
                if answered is not None and time.monotonic() - answered > IDLE:
                    await _drop_if_closed(self._socket)
                if self._socket.closed():
                    await connection.connect()
                # A list: the sync send_packed_command takes bytes as a sequence of chunks.
                await connection.send_packed_command([pack(args)])
                reply = await connection.read_response()
        except TimeoutError:
            raise RedisTimeoutError(f"no answer within {self._socket.timeout}s") from None
        self._answered = time.monotonic()
        return reply

    async def run_waited(
        self, script: Lua, requests: list[Request], wait: tuple[int, float]
    ) -> tuple[list[Any], int]:
        """Run ``script`` once per request, then ``WAIT`` for ``wait`` = (replicas,
        seconds): that many replicas to have their writes, within that time. The
        answers (an error in place of an answer that is one), and how many replicas
        acknowledged them.

        Sent as one pipeline on one connection of the client's pool: ``WAIT`` counts
        the writes made on its own connection. When the server had no script (after a
        failover, say), it is loaded and everything sent again; had some requests run
        and others not, nothing can vouch for those that did: -1 acknowledged.
        """
        client: Any = self._client
        return await reloading(
            lambda: self._waited(script, requests, wait),
            lambda: client.execute_command("SCRIPT", "LOAD", script.source),
        )

    async def _waited(
        self, script: Lua, requests: list[Request], wait: tuple[int, float]
    ) -> tuple[list[Any], int]:
        pipe: Any = self._client.pipeline(transaction=False)
        for keys, args in requests:
            pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
        replicas, timeout = wait
        pipe.execute_command("WAIT", replicas, wait_time_ms(timeout, self._socket.timeout))
        *answers, acked = await pipe.execute(raise_on_error=False)
        if isinstance(acked, BaseException):
            raise acked
        return answers, int(acked)

    async def aclose(self) -> None:
        """Close the connection, the client's pool and its Sentinels' clients."""
        try:
            if self._pid == os.getpid():
                await self._socket.connection.disconnect()
        finally:
            await self._client.aclose()
            for sentinel in sentinels_of(self._client):
                await sentinel.aclose()


async def _drop_if_closed(socket: AsyncSocket) -> None:
    """Disconnect the socket's connection if the server has closed it (or sent what
    nobody asked for)."""
    try:
        closed = await socket.readable()
    except REDIS_ERRORS:  # the sync can_read() raises on the server's end of the stream
        closed = True
    if closed:
        await socket.connection.disconnect()
