# Generated from backends/etcd/multilock_etcd/_async/_gateway.py
# by scripts/async_to_sync.py: do not edit; change that file and rerun.
"""etcd's v3 JSON gateway: the source of both APIs' requests.

The sync twin in ``_sync/`` is generated from this module by ``scripts/async_to_sync.py``.

One member is asked at a time, the first of the URL to begin with. A request that
could not reach it (refused, no route, connect timeout: nothing was sent) goes to the
next member; any later failure is reported -- the request may have been applied -- and
the next request starts with the next member. Every request is bounded by the locker's
``timeout``: the connect by what is left of it (at most ``connect_timeout``), the
exchange by what is left after the connect (see ``_streams``).

The async gateway can also *start* a request on an idle connection, from a plain
callback (:meth:`AsyncGateway.start`): the answer comes to a callback of the caller's,
settled by the connection's protocol, with no task or event-loop turn of its own.

Connections are kept for the next request (one per request in flight at once); one
found closed by the member while it was idle is replaced before the request is sent.

With a user name in the URL, the gateway authenticates once and sends etcd's token with
every request; a token etcd no longer accepts (they expire) is renewed and the request,
refused without being applied, is sent again.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

from .._config import EtcdConfig
from .._errors import NOT_SENT, TRANSPORT_ERRORS, GatewayError, translate
from .._streams import forks
from .._timeouts import sync_bounded
from ._http import Connection

__all__ = ["Gateway"]


class Gateway:
    """Requests to one etcd cluster, answered as parsed JSON."""

    def __init__(self, config: EtcdConfig, timeout: float | None = None) -> None:
        self.config = config
        self.timeout = config.timeout if timeout is None else timeout
        self._idle: list[Connection] = []
        self._forks = forks()
        self._member = 0
        # No Content-Type: the gateway reads a body without one as JSON (its default
        # marshaler), and h11 checks one header less per request.
        self._headers: list[tuple[bytes, bytes]] = []
        self._authenticated = config.username is None

    def call(self, path: str, body: bytes, doing: str) -> dict[str, Any]:
        """POST ``body`` to ``path``; etcd's answer, or the multilock error for ``doing``."""
        try:
            return self.request(path, body)
        except (GatewayError, *TRANSPORT_ERRORS) as exc:
            raise translate(exc, self.config.url, doing) from None

    def request(self, path: str, body: bytes) -> dict[str, Any]:
        """POST ``body`` to ``path``; etcd's answer. Raises :class:`GatewayError` for an
        error answer, and a transport error (``TRANSPORT_ERRORS``) when there is none."""
        if not self._authenticated:
            self._authenticate()
        try:
            return self._post(path, body)
        except GatewayError as exc:
            if not exc.auth_expired or self.config.username is None:
                raise
        self._authenticated = False
        self._authenticate()
        return self._post(path, body)

    def _authenticate(self) -> None:
        credentials = {"name": self.config.username, "password": self.config.password}
        self._headers = []
        try:
            answer = self._post("/v3/auth/authenticate", json.dumps(credentials).encode())
        except GatewayError as exc:
            if "authentication is not enabled" not in exc.message:
                raise
        else:
            self._headers = [(b"Authorization", str(answer["token"]).encode())]
        self._authenticated = True

    def _connection(self, deadline: float) -> Connection:
        """An idle connection to the current member, or a new one."""
        if self._forks != forks():  # a forked child must not share its parent's sockets
            self._idle, self._forks = [], forks()
        while self._idle:
            connection = self._idle.pop()
            if connection.reusable():
                return connection
            connection.close()
        host, port = self.config.endpoints[self._member]
        left = max(0.001, min(deadline - time.monotonic(), self.config.connect_timeout))
        return Connection.open(host, port, self.config.ssl_context, left)

    def _switch_member(self) -> list[Connection]:
        """Ask the next member from now on (the current one failed); the idle
        connections to the old one, which the caller closes."""
        self._member = (self._member + 1) % len(self.config.endpoints)
        idle, self._idle = self._idle, []
        return idle

    def _next_member(self) -> None:
        """Ask the next member from now on (the current one failed)."""
        for connection in self._switch_member():
            connection.close()

    def _post(self, path: str, body: bytes) -> dict[str, Any]:
        # The connect is bounded by what is left (at most connect_timeout), the exchange
        # by what is left after it: the request by ``timeout`` in all.
        deadline = time.monotonic() + self.timeout
        target = path.encode()
        for attempt in range(len(self.config.endpoints)):
            try:
                connection = self._connection(deadline)
                try:
                    left = max(0.001, deadline - time.monotonic())
                    status, content = connection.request(target, self._headers, body, left)
                except BaseException:
                    connection.close()
                    raise
            except NOT_SENT:
                self._next_member()
                if attempt == len(self.config.endpoints) - 1 or time.monotonic() >= deadline:
                    raise
                continue
            except TRANSPORT_ERRORS:
                self._next_member()
                raise
            self._idle.append(connection)
            return _answer(status, content)
        raise AssertionError("unreachable: the last member's failure is raised")

    def lines(self, path: str, body: bytes, idle: float) -> Iterator[dict[str, Any]]:
        """POST ``body`` to a streaming ``path`` (a watch) and yield each message as it
        comes. Ends with a transport error when nothing came for ``idle`` seconds."""
        if not self._authenticated:
            self._authenticate()
        connection = self._connection(time.monotonic() + self.config.connect_timeout)
        try:
            pieces = connection.stream(path.encode(), self._headers, body, idle)
            with sync_bounded(idle):
                status = int(pieces.__next__())
            pending = b""
            while True:
                try:
                    with sync_bounded(idle):
                        piece = pieces.__next__()
                except StopIteration:
                    return
                if status != 200:
                    _answer(status, piece)
                pending += piece
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    if line.strip():
                        yield _message(line)
        except TRANSPORT_ERRORS:
            self._next_member()
            raise
        finally:
            connection.close()

    def close(self) -> None:
        """Close every connection."""
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()


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
