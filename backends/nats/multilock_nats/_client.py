"""One nats-py connection and the lock bucket: the JetStream requests a lock is made of.

A lock is the last (and only) message of its key's subject in the bucket's stream:
``$KV.<bucket>.<key>``, holding the owner token.

* **acquire**: publish with ``Nats-Expected-Last-Subject-Sequence: 0`` -- stored only if
  the subject has no message. Its stream sequence (the key's revision) is the fencing
  token. A refusal is "held elsewhere", unless the subject's last message is a delete or
  purge marker that a KV client left: then once more, expecting that marker.
* **renew** (and extend): publish the token again, expecting the revision we hold; the
  bucket keeps one message per key, so the new one replaces it and the bucket's TTL runs
  from now. It carries the fencing token in a header, for ``locks()``.
* **release**: purge the subject's messages *up to* our revision -- a newer holder's
  message is never touched, and no marker is left behind for the next acquire.

nats-py is asyncio only: a client belongs to the loop that first uses it. It connects
without nats-py's reconnection (which would replay buffered publishes later, unseen): a
lost connection fails the calls in flight, and the next call connects again, bounded by
``connect_timeout``.

:meth:`Client.send` is the started path's request: sent on nats-py's connection during
the call, its reply handed to a callback from nats-py's reader (see :class:`_Reply`)
-- no task and no ``wait_for`` per request, and a caller cancelled meanwhile leaves the
reply to that callback.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import nats
import nats.aio.client
import nats.errors
import nats.js
import nats.js.errors
from nats.aio.msg import Msg
from nats.aio.transport import TcpTransport
from nats.js.api import DeliverPolicy, KeyValueConfig, StorageType
from nats.protocol.command import hpub_cmd, pub_cmd

from multilock.errors import MultilockError

from ._config import NatsConfig
from ._errors import NATS_ERRORS, WRONG_LAST_SEQUENCE, NoTLS

__all__ = ["FENCE_HEADER", "Client", "Holder", "Settle", "answer", "purged", "sequence"]

_log = logging.getLogger("multilock.nats")
_EXPECT_LAST = "Nats-Expected-Last-Subject-Sequence"
FENCE_HEADER = "Multilock-Fence"
_MARKERS = frozenset({"DEL", "PURGE"})
_CREATE_HEADERS = f"NATS/1.0\r\n{_EXPECT_LAST}: 0\r\n\r\n".encode()
_NO_RESPONDERS = "503"

# nats-py's private state that :meth:`Client.send` uses; without it (another nats-py),
# every request awaits nats-py's own ``request``.
_SEND_STATE = frozenset(
    {"_resp_map", "_resp_sub_prefix", "_pending", "_pending_data_size", "_max_pending_size",
     "_flush_queue", "_flusher_task", "_transport", "stats"}
)  # fmt: skip

Settle = Callable[[Msg | None, BaseException | None], None]
"""A started request's callback: its reply, or the error it met (never both)."""


@dataclass(frozen=True)
class Holder:
    """A key of the bucket as ``locks()`` reports it."""

    key: str
    token: str
    revision: int
    fence: int
    written: datetime
    expires: datetime


async def _quiet(exc: Exception) -> None:
    """nats-py's error callback: the calls that fail report it; nothing to log here."""


class _Connection(nats.aio.client.Client):
    """nats-py's client, refusing a server whose greeting does not require TLS when the
    URL asks for it. nats-py upgrades only when the greeting says ``tls_required``, and
    would otherwise send CONNECT, credentials included, in clear: a man in the middle
    can take that flag out of the greeting."""

    def __init__(self, insist_on_tls: bool) -> None:
        super().__init__()
        self._insist_on_tls = insist_on_tls

    async def _process_info(self, info: dict[str, Any], initial_connection: bool = False) -> None:
        if initial_connection and self._insist_on_tls and not info.get("tls_required"):
            raise NoTLS
        await super()._process_info(info, initial_connection)


class _Reply(asyncio.Future[Msg]):
    """A started request's slot in nats-py's response map (what its own ``request``
    puts there): nats-py's reader sets the reply, which goes to ``settle`` at once --
    rather than waking a waiter one event-loop turn later, and the caller one more. A
    reply that does not come within the timeout settles with nats-py's timeout error."""

    def __init__(self, responses: dict[str, Any], token: str, timeout: float, settle: Settle):
        super().__init__()
        self._responses, self._token, self._settle = responses, token, settle
        self._timer = self.get_loop().call_later(timeout, self._expire)

    def set_result(self, result: Msg, /) -> None:
        """The reply is in (nats-py's reader, or its request subscription's callback)."""
        if self.done():
            return
        super().set_result(result)
        self._timer.cancel()
        self._responses.pop(self._token, None)
        self._settle(result, None)

    def _expire(self) -> None:
        if self.done():
            return
        super().cancel()  # done, with nothing left for nobody to read
        self._responses.pop(self._token, None)
        self._settle(None, nats.errors.TimeoutError())


class Client:
    """A connection to the NATS servers of a URL, and its bucket, in one event loop."""

    def __init__(self, config: NatsConfig) -> None:
        self.config = config
        self.max_age: float | None = None
        """The bucket's TTL (seconds), once connected."""
        self._nc: nats.aio.client.Client | None = None
        self._js: nats.js.JetStreamContext | None = None
        self._lock: asyncio.Lock | None = None
        # Started requests' reply tokens: unlike nats-py's (a NUID and 4 hex digits) in
        # length, so never one of its own requests'.
        self._tokens = itertools.count()
        self._can_send = False

    async def ready(self) -> nats.js.JetStreamContext:
        """The JetStream context, connecting (and finding or creating the bucket) first
        if there is no open connection."""
        nc, js = self._nc, self._js
        if nc is not None and js is not None and nc.is_connected:
            return js
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._nc is not None and self._js is not None and self._nc.is_connected:
                return self._js
            await self._discard()
            nc = _Connection(insist_on_tls=self.config.ssl_context is not None)
            try:
                async with asyncio.timeout(self.config.connect_timeout):
                    await nc.connect(
                        servers=list(self.config.servers),
                        user=self.config.user,
                        password=self.config.password,
                        token=self.config.token,
                        tls=self.config.ssl_context,
                        # nats-py annotates these as int; it uses them as seconds, floats fine.
                        connect_timeout=self.config.connect_timeout,  # type: ignore[arg-type]
                        allow_reconnect=False,
                        max_reconnect_attempts=1,
                        reconnect_time_wait=0.05,  # type: ignore[arg-type]
                        error_cb=_quiet,
                        name="multilock",
                    )
                    js = nc.jetstream(timeout=self.config.timeout)
                    if self.max_age is None:
                        self.max_age = await self._bucket(js)
            except BaseException:
                await _close(nc)
                raise
            self._nc, self._js = nc, js
            self._can_send = _SEND_STATE.issubset(vars(nc))
            return js

    async def _bucket(self, js: nats.js.JetStreamContext) -> float:
        """The bucket's TTL; the bucket is created (one key per name, the URL's
        ``bucket_ttl``, on disk) when it does not exist."""
        try:
            info = await js.stream_info(self.config.stream)
        except nats.js.errors.NotFoundError:
            config = KeyValueConfig(
                bucket=self.config.bucket,
                description="multilock's locks",
                history=1,
                ttl=self.config.bucket_ttl,
                storage=StorageType.FILE,
            )
            try:
                await js.create_key_value(config)
            except nats.js.errors.BadRequestError:
                pass  # created meanwhile by another locker: use it as it is
            info = await js.stream_info(self.config.stream)
        max_age = float(info.config.max_age or 0)
        if max_age <= 0:
            raise MultilockError(
                f"bucket {self.config.bucket!r} of {self.config.url.masked} has no TTL:"
                " the key of a crashed holder would never go. Give it one (nats kv add"
                " --ttl), or name a bucket that does not exist yet: multilock creates it"
                " with the URL's bucket_ttl"
            )
        return max_age

    async def _publish(self, subject: str, token: bytes, headers: dict[str, str]) -> int:
        """Publish to JetStream and wait for its acknowledgement: the message's sequence.

        nats-py's ``js.publish`` made by hand: the same request, its answer read without
        building a ``PubAck`` (a tenth of an uncontended lock cycle, measured).
        """
        if self._nc is None or self._js is None or not self._nc.is_connected:
            await self.ready()
        assert self._nc is not None
        try:
            reply = await self._nc.request(
                subject, token, timeout=self.config.timeout, headers=headers
            )
        except nats.errors.NoRespondersError:
            raise nats.js.errors.NoStreamResponseError from None
        return sequence(reply)

    def send(self, subject: str, payload: bytes, settle: Settle, *, create: bool = False) -> bool:
        """Send a request now, without awaiting (the started path); ``create``: expecting
        no message on ``subject`` (an acquire's headers). ``settle`` is called once: from
        nats-py's reader with the reply, or with nats-py's timeout error after
        ``timeout``. ``False``, with nothing sent, when the request cannot go at once
        (not connected, nats-py's reply subscription not made yet, its buffer full):
        await the request instead.

        It is nats-py's ``request`` and ``publish`` made by hand, on their private
        state (``_SEND_STATE``, checked per connection): the reply slot in its response
        map; the command written to the socket if nothing is queued before it, else
        queued and the flusher woken, as ``publish`` does.
        """
        nc = self._nc
        if nc is None or not self._can_send or not nc.is_connected or nc.is_draining_pubs:
            return False
        prefix, flushing, flusher = nc._resp_sub_prefix, nc._flush_queue, nc._flusher_task
        if not prefix or flushing is None or flushing.full() or flusher is None or flusher.done():
            return False
        token = f"m{next(self._tokens)}"
        inbox = prefix.decode() + token
        if create:
            command = hpub_cmd(subject, inbox, _CREATE_HEADERS, payload)
        else:
            command = pub_cmd(subject, inbox, payload)
        if nc._pending_data_size + len(command) > nc._max_pending_size:
            return False  # publish would wait for the flush: let it
        nc._resp_map[token] = _Reply(nc._resp_map, token, self.config.timeout, settle)
        nc.stats["out_msgs"] += 1
        nc.stats["out_bytes"] += len(payload)
        if not nc._pending and isinstance(nc._transport, TcpTransport):
            # Nothing queued before it: to the socket now (as nats-py writes a PING), an
            # event-loop turn before its flusher would.
            nc._transport.write(command)  # type: ignore[no-untyped-call]
            return True
        nc._pending.append(command)
        nc._pending_data_size += len(command)
        if flushing.empty():
            flushing.put_nowait(asyncio.get_running_loop().create_future())
        return True

    def purge_request(self, subject: str, revision: int) -> tuple[str, bytes]:
        """The subject and payload of a purge of ``subject`` up to ``revision``."""
        # A subject of the bucket needs no JSON escape (see _keys; the bucket's name and
        # the prefix are checked alike): formatted, not json.dumps'd, on the hot path.
        payload = f'{{"filter":"{subject}","seq":{revision + 1}}}'.encode()
        return f"$JS.API.STREAM.PURGE.{self.config.stream}", payload

    async def acquire(self, subject: str, token: bytes) -> int | None:
        """Store ``token`` as ``subject``'s only message; its revision, or ``None`` if the
        subject is held."""
        try:
            return await self._publish(subject, token, {_EXPECT_LAST: "0"})
        except nats.js.errors.APIError as exc:
            if exc.err_code != WRONG_LAST_SEQUENCE:
                raise
            return await self.acquire_refused(subject, token, exc)

    async def acquire_refused(
        self, subject: str, token: bytes, refusal: nats.js.errors.APIError
    ) -> int | None:
        """:meth:`acquire` after the server's ``refusal`` (the subject has a message):
        ``None``, unless that message is a KV client's marker -- then once more."""
        last = _last_sequence(refusal)
        if last is None or not await self._is_marker(await self.ready(), last):
            return None
        try:  # a delete or purge marker of a KV client: the key is free
            return await self._publish(subject, token, {_EXPECT_LAST: str(last)})
        except nats.js.errors.APIError as exc:
            if exc.err_code != WRONG_LAST_SEQUENCE:
                raise
            return None

    async def _is_marker(self, js: nats.js.JetStreamContext, sequence: int) -> bool:
        try:
            message = await js.get_msg(self.config.stream, seq=sequence)
        except nats.js.errors.NotFoundError:
            return False  # gone meanwhile: held by whoever wrote the next one
        return bool(message.headers and message.headers.get("KV-Operation") in _MARKERS)

    async def renew(self, subject: str, token: bytes, revision: int, fence: int) -> int | None:
        """Write ``token`` again if ``revision`` is still ``subject``'s last message;
        the new revision, or ``None`` if it is not (taken, expired or purged)."""
        headers = {_EXPECT_LAST: str(revision), FENCE_HEADER: str(fence)}
        try:
            return await self._publish(subject, token, headers)
        except nats.js.errors.APIError as exc:
            if exc.err_code != WRONG_LAST_SEQUENCE:
                raise
            return None

    async def release(self, subject: str, revision: int) -> bool:
        """Purge ``subject``'s messages up to ``revision``: whether ours was still there."""
        if self._nc is None or not self._nc.is_connected:
            await self.ready()
        assert self._nc is not None
        purge, request = self.purge_request(subject, revision)
        return purged(await self._nc.request(purge, request, timeout=self.config.timeout))

    async def holders(self) -> list[Holder]:
        """Every key of the bucket under the locker's prefix, with its last message.

        One ordered consumer delivers each subject's last message (what a KV ``keys()``
        watch does): a few requests whatever the number of keys, each message awaited
        at most ``timeout``."""
        js = await self.ready()
        start = self.config.subjects + self.config.prefix
        max_age = timedelta(seconds=self.max_age or 0)
        sub = await js.subscribe(
            f"{self.config.subjects}>",
            stream=self.config.stream,
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
            inactive_threshold=max(5.0, 2 * self.config.timeout),
        )
        found = []
        try:
            info = await sub.consumer_info()
            # Delivered already, or still to come: read up to the message after which
            # nothing is pending.
            delivered = info.delivered.consumer_seq if info.delivered else 0
            more = bool(info.num_pending or delivered)
            while more:
                message = await sub.next_msg(timeout=self.config.timeout)
                meta = message.metadata
                more = meta.num_pending > 0
                headers = message.headers or {}
                if not message.subject.startswith(start) or headers.get("KV-Operation") in _MARKERS:
                    continue
                fence = headers.get(FENCE_HEADER)
                found.append(
                    Holder(
                        key=message.subject[len(self.config.subjects) :],
                        token=(message.data or b"").decode("utf-8", "replace"),
                        revision=meta.sequence.stream,
                        fence=int(fence) if fence else meta.sequence.stream,
                        written=meta.timestamp,
                        expires=meta.timestamp + max_age,
                    )
                )
        finally:
            await sub.unsubscribe()
        return found

    async def purge(self, subject: str) -> None:
        """Purge every message of ``subject`` (the conformance hook's broken lease)."""
        await self.ready()
        assert self._nc is not None
        request = json.dumps({"filter": subject}).encode()
        await self._nc.request(
            f"$JS.API.STREAM.PURGE.{self.config.stream}", request, timeout=self.config.timeout
        )

    async def _discard(self) -> None:
        nc, self._nc, self._js = self._nc, None, None
        if nc is not None:
            await _close(nc)

    async def close(self) -> None:
        """Close the connection (bounded by the timeout; errors are of no use now)."""
        await self._discard()


def answer(reply: Msg) -> dict[str, Any]:
    """A JetStream API reply, decoded; its error raised (``APIError``), and no responder
    (no stream on the subject) as ``NoStreamResponseError``."""
    headers = reply.headers
    if headers and headers.get("Status") == _NO_RESPONDERS:
        raise nats.js.errors.NoStreamResponseError
    decoded: dict[str, Any] = json.loads(reply.data)
    if "error" in decoded:
        nats.js.errors.APIError.from_error(decoded["error"])
    return decoded


def sequence(reply: Msg) -> int:
    """A publish's acknowledgement: the message's stream sequence."""
    return int(answer(reply)["seq"])


def purged(reply: Msg) -> bool:
    """A purge's answer: whether it removed a message."""
    return int(answer(reply).get("purged", 0)) > 0


def _last_sequence(exc: nats.js.errors.APIError) -> int | None:
    """The subject's last sequence, from "wrong last sequence: N"."""
    try:
        return int(str(exc.description).rsplit(":", 1)[1])
    except (IndexError, ValueError):
        return None


async def _close(nc: nats.aio.client.Client) -> None:
    try:
        async with asyncio.timeout(1.0):
            await nc.close()
    except (*NATS_ERRORS, asyncio.CancelledError):
        pass
