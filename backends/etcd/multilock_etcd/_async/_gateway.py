"""etcd's v3 JSON gateway over HTTP/1.1, through httpcore: the source of both APIs' transport.

The sync twin in ``_sync/`` is generated from this module by ``scripts/unasync.py``.

One member is asked at a time, the first of the URL to begin with. A request that
could not reach it (refused, no route, connect timeout: nothing was sent) goes to the
next member; any later failure is reported -- the request may have been applied -- and
the next request starts with the next member. Every request is bounded by the locker's
``timeout``: each phase (connect, send, answer) by what is left of it, and the async
API's whole request by one ``asyncio.timeout`` as well.

With a user name in the URL, the gateway authenticates once and sends etcd's token with
every request; a token etcd no longer accepts (they expire) is renewed and the request,
refused without being applied, is sent again.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import httpcore

from .._config import EtcdConfig
from .._errors import NOT_SENT, TRANSPORT_ERRORS, GatewayError, translate
from .._timeouts import async_bounded

__all__ = ["AsyncGateway"]

_JSON = (b"Content-Type", b"application/json")


class AsyncGateway:
    """Requests to one etcd cluster, answered as parsed JSON."""

    def __init__(self, config: EtcdConfig, timeout: float | None = None) -> None:
        self.config = config
        self.timeout = config.timeout if timeout is None else timeout
        self._pool = self._new_pool()
        self._pid = os.getpid()
        self._member = 0
        self._headers = [_JSON]
        self._authenticated = config.username is None

    def _new_pool(self) -> httpcore.AsyncConnectionPool:
        return httpcore.AsyncConnectionPool(ssl_context=self.config.ssl_context, retries=0)

    async def call(self, path: str, body: bytes, doing: str) -> dict[str, Any]:
        """POST ``body`` to ``path``; etcd's answer, or the multilock error for ``doing``."""
        try:
            return await self.request(path, body)
        except (GatewayError, *TRANSPORT_ERRORS) as exc:
            raise translate(exc, self.config.url, doing) from None

    async def request(self, path: str, body: bytes) -> dict[str, Any]:
        """POST ``body`` to ``path``; etcd's answer. Raises :class:`GatewayError` for an
        error answer and httpcore's (or the OS's) errors when there is none."""
        if self._pid != os.getpid():  # a forked child must not share its parent's sockets
            self._pool, self._pid = self._new_pool(), os.getpid()
        if not self._authenticated:
            await self._authenticate()
        try:
            return await self._post(path, body)
        except GatewayError as exc:
            if not exc.auth_expired or self.config.username is None:
                raise
        self._authenticated = False
        await self._authenticate()
        return await self._post(path, body)

    async def _authenticate(self) -> None:
        credentials = {"name": self.config.username, "password": self.config.password}
        self._headers = [_JSON]
        try:
            answer = await self._post("/v3/auth/authenticate", json.dumps(credentials).encode())
        except GatewayError as exc:
            if "authentication is not enabled" not in exc.message:
                raise
        else:
            self._headers = [_JSON, (b"Authorization", str(answer["token"]).encode())]
        self._authenticated = True

    async def _post(self, path: str, body: bytes) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout
        members = self.config.endpoints
        for attempt in range(len(members)):
            url = members[self._member] + path
            try:
                return await self._send(url, body, deadline)
            except NOT_SENT:
                self._member = (self._member + 1) % len(members)
                if attempt == len(members) - 1 or time.monotonic() >= deadline:
                    raise
            except TRANSPORT_ERRORS:
                self._member = (self._member + 1) % len(members)
                raise
        raise AssertionError("unreachable: the last member's failure is raised")

    def _timeouts(self, deadline: float) -> dict[str, float]:
        left = max(0.001, deadline - time.monotonic())
        connect = min(left, self.config.connect_timeout)
        return {"connect": connect, "read": left, "write": left, "pool": left}

    async def _send(self, url: str, body: bytes, deadline: float) -> dict[str, Any]:
        timeouts = self._timeouts(deadline)
        async with async_bounded(timeouts["read"]):
            response = await self._pool.request(
                "POST", url, headers=self._headers, content=body, extensions={"timeout": timeouts}
            )
        return _answer(response.status, response.content)

    async def lines(self, path: str, body: bytes, idle: float) -> AsyncIterator[dict[str, Any]]:
        """POST ``body`` to a streaming ``path`` (a watch) and yield each message as it
        comes. Ends with a transport error when nothing came for ``idle`` seconds."""
        if not self._authenticated:
            await self._authenticate()
        url = self.config.endpoints[self._member] + path
        connect = self.config.connect_timeout
        timeouts = {"connect": connect, "read": idle, "write": idle, "pool": idle}
        try:
            async with self._pool.stream(
                "POST", url, headers=self._headers, content=body, extensions={"timeout": timeouts}
            ) as response:
                if response.status != 200:
                    _answer(response.status, await response.aread())
                pending = b""
                async for chunk in response.aiter_stream():
                    pending += chunk
                    while b"\n" in pending:
                        line, pending = pending.split(b"\n", 1)
                        if line.strip():
                            yield _message(line)
        except TRANSPORT_ERRORS:
            self._member = (self._member + 1) % len(self.config.endpoints)
            raise

    async def aclose(self) -> None:
        """Close every connection."""
        await self._pool.aclose()


def _answer(status: int, content: bytes) -> dict[str, Any]:
    """The answer of a 200, or the :class:`GatewayError` of any other status."""
    try:
        answer: dict[str, Any] = json.loads(content)
    except ValueError:
        answer = {}
    if status == 200 and "error" not in answer:
        return answer
    message = str(answer.get("message") or answer.get("error") or f"HTTP status {status}")
    raise GatewayError(int(answer.get("code", 0)), message, status)


def _message(line: bytes) -> dict[str, Any]:
    """One message of a stream: ``{"result": ...}``, or an error."""
    message: dict[str, Any] = json.loads(line)
    if "result" not in message:
        error = message.get("error", {})
        raise GatewayError(int(error.get("grpc_code", 0)), str(error.get("message")), 200)
    result: dict[str, Any] = message["result"]
    return result
