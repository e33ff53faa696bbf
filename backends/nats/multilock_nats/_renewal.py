"""Automatic renewal: a task in a portal's loop (a thread of its own), per locker.

The bucket's TTL (``max_age``) runs from a key's last write: a lease is renewed by
writing its token again, expecting the revision it holds, every third of its *span* --
its ttl, or the bucket's TTL where that is shorter. The leases due together are renewed
concurrently on one connection. When the write is refused (the key was purged, expired,
or is another holder's), ``lost`` fires at once; when NATS cannot be asked, the renewal
is retried until the span has passed unconfirmed, and then ``lost`` fires.

A renewal replaces the lease's message with a new revision, so a release must purge up
to the *new* one: a release waits for a renewal of its lease already in flight
(:meth:`Renewer.writing`), and a renewal never starts for a released lease. The
handshake is under one lock, since the release may run in another thread's loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from ._client import Client
from ._errors import NATS_ERRORS, translate
from ._portal import Portal

__all__ = ["Renewer"]

_log = logging.getLogger("multilock.nats")
_RETRY_CAP = 1.0  # the longest pause between two attempts while NATS is unreachable
_MIN_TIMEOUT = 0.005


class _Schedule:
    __slots__ = ("deadline", "due", "span")

    def __init__(self, span: float, start: float) -> None:
        self.span = span
        self.confirm(start)

    def confirm(self, start: float) -> None:
        """NATS stored the lease's write sent at monotonic ``start``."""
        self.deadline = start + self.span
        self.due = start + self.span / 3


class Renewer:
    """Renews the leases of one locker until they are released or lost.

    ``on_lost(lease, reason)`` is called (in the portal's loop) for a lease that is
    gone; it must fire the lease's ``lost`` signal. A lease has ``_subject``, ``_token``,
    ``_rev`` (the revision it holds), ``fencing_token``, ``_ttl``, ``_span`` and
    ``_renewing``.
    """

    def __init__(self, portal: Portal, client: Client, on_lost: Callable[[Any, str], None]) -> None:
        self.portal = portal
        self.client = client
        self._on_lost = on_lost
        self._guard = threading.Lock()
        self._leases: dict[Any, _Schedule] = {}  # touched in the portal's loop only
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None

    def add(self, leases: list[Any], start: float) -> None:
        """Renew ``leases``, written at monotonic time ``start``, from now on."""
        self.portal.loop.call_soon_threadsafe(self._add, leases, start)

    def confirmed(self, lease: Any, start: float) -> None:
        """``lease`` was written again (an extend) at monotonic time ``start``."""
        self.add([lease], start)

    def discard(self, lease: Any) -> None:
        """Stop renewing ``lease``."""
        self.portal.loop.call_soon_threadsafe(self._leases.pop, lease, None)

    @contextlib.asynccontextmanager
    async def writing(self, lease: Any) -> AsyncIterator[None]:
        """Hold off the renewal of ``lease`` while the caller writes it (a release or an
        extend): first wait, bounded by the timeout, for a renewal already in flight,
        whose new revision the caller must use."""
        deadline = time.monotonic() + self.client.config.timeout
        mine: concurrent.futures.Future[None] | None
        while True:
            with self._guard:
                waiting: concurrent.futures.Future[None] | None = lease._renewing
                if waiting is None:
                    mine = lease._renewing = concurrent.futures.Future()
                    break
            try:
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    await asyncio.wrap_future(waiting)
            except TimeoutError:
                mine = None  # a renewal that hangs: write with what we know
                break
        try:
            yield
        finally:
            if mine is not None:
                with self._guard:
                    lease._renewing = None
                mine.set_result(None)

    def stop(self) -> None:
        """Stop renewing (the portal and the client are the caller's to stop)."""
        self.portal.loop.call_soon_threadsafe(self._stop)

    def _stop(self) -> None:
        # Not cancelled: a renewal in flight finishes, so that a release waiting for it
        # (see writing) learns its revision. The task ends with nothing left to renew.
        self._leases.clear()
        if self._wake is not None:
            self._wake.set()

    def _add(self, leases: list[Any], start: float) -> None:
        for lease in leases:
            if not lease._released and not lease.lost.is_set():
                self._leases[lease] = _Schedule(lease._span, start)
        if self._wake is None:
            self._wake = asyncio.Event()
        self._wake.set()
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        assert self._wake is not None
        while self._leases:
            now = time.monotonic()
            due = [(lease, s) for lease, s in self._leases.items() if s.due <= now + s.span / 6]
            if not due:
                self._wake.clear()
                wake = min(s.due for s in self._leases.values())
                try:
                    async with asyncio.timeout(wake - now):
                        await self._wake.wait()
                except TimeoutError:
                    pass
                continue
            await asyncio.gather(*(self._renew(lease, schedule) for lease, schedule in due))

    async def _renew(self, lease: Any, schedule: _Schedule) -> None:
        with self._guard:
            if lease._released or lease.lost.is_set():
                self._leases.pop(lease, None)
                return
            if lease._renewing is not None:  # a release or an extend is writing it
                schedule.due = time.monotonic() + _RETRY_CAP / 10
                return
            done = lease._renewing = concurrent.futures.Future()
        sent = time.monotonic()
        budget = max(_MIN_TIMEOUT, min(self.client.config.timeout, schedule.deadline - sent))
        try:
            async with asyncio.timeout(budget):
                revision = await self.client.renew(
                    lease._subject, lease._token, lease._rev, lease.fencing_token
                )
        except NATS_ERRORS as exc:
            self._failed(lease, schedule, str(translate(exc, self.client.config.url, "renewing")))
        else:
            if revision is None:
                self._lose(lease, f"lock {lease.key!r} expired, was purged or taken on the server")
            else:
                lease._rev = revision
                if schedule.deadline < sent + schedule.span:
                    schedule.confirm(sent)
                lease._set_expiry(lease._ttl)
        finally:
            with self._guard:
                lease._renewing = None
            done.set_result(None)

    def _failed(self, lease: Any, schedule: _Schedule, reason: str) -> None:
        now = time.monotonic()
        if now < schedule.deadline:
            schedule.due = min(now + min(schedule.span / 10, _RETRY_CAP), schedule.deadline)
            _log.warning("%s; retrying until the lease expires", reason)
            return
        self._lose(lease, f"lease could not be renewed before its expiry: {reason}")

    def _lose(self, lease: Any, reason: str) -> None:
        self._leases.pop(lease, None)
        if not lease._released:
            _log.warning("lease %r lost: %s", lease.key, reason)
            self._on_lost(lease, reason)
