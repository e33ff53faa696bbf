"""Automatic renewal: a task in a portal's loop (a thread of its own), per locker.

The bucket's TTL (``max_age``) runs from a key's last write: a lease is renewed by
writing its token again, expecting the revision it holds, every third of its *span* --
its ttl, or the bucket's TTL where that is shorter. The leases due together are renewed
concurrently on one connection. When the write is refused (the key was purged, expired,
or is another holder's), ``lost`` fires at once; when NATS cannot be asked, the renewal
is retried until the span has passed unconfirmed, and then ``lost`` fires.

A renewal replaces the lease's message with a new revision, so a release must purge up
to the *new* one: a release waits for a renewal of its lease already in flight
(:meth:`Renewer.claim`), and a renewal never starts for a released lease. The
handshake is under one lock, since the release may run in another thread's loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from ._client import Client
from ._errors import NATS_ERRORS, translate
from ._portal import Portal

__all__ = ["Renewer"]

_log = logging.getLogger("multilock.nats")
_RETRY_CAP = 1.0  # the longest pause between two attempts while NATS is unreachable
_MIN_TIMEOUT = 0.005


_WRITING: Any = object()
"""``lease._renewing`` while a release or an extend writes the lease."""


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
        # Under the guard: the leases, when the task wakes next, whether it runs.
        self._leases: dict[Any, _Schedule] = {}
        self._wake_at = math.inf
        self._started = False
        self._stopping = False
        # An idle task wakes up as often as a lease of the default ttl would need it: then
        # acquiring such a lease never has to wake it early (no hand-over to its thread).
        self._idle = client.config.ttl / 3
        self._event: asyncio.Event | None = None  # the portal loop's
        self._task: asyncio.Task[None] | None = None

    def add(self, leases: list[Any], start: float) -> None:
        """Renew ``leases``, written at monotonic time ``start``, from now on."""
        poke = False
        with self._guard:
            for lease in leases:
                schedule = self._leases[lease] = _Schedule(lease._span, start)
                if schedule.due < self._wake_at:
                    self._wake_at = schedule.due
                    poke = True
            begin, self._started = not self._started, True
        if begin:
            self.portal.loop.call_soon_threadsafe(self._begin)
        elif poke:
            self.portal.loop.call_soon_threadsafe(self._poke)

    def confirmed(self, lease: Any, start: float) -> None:
        """``lease`` was written again (an extend) at monotonic time ``start``."""
        self.add([lease], start)

    def discard(self, lease: Any) -> None:
        """Stop renewing ``lease``."""
        with self._guard:
            self._leases.pop(lease, None)

    async def claim(self, lease: Any) -> None:
        """Hold off the renewal of ``lease`` while the caller writes it (a release or an
        extend; then :meth:`unclaim`). First wait, bounded by the timeout, for a renewal
        already in flight, whose new revision the caller must use."""
        deadline = time.monotonic() + self.client.config.timeout
        while True:
            with self._guard:
                waiting = lease._renewing
                if waiting is None:
                    lease._renewing = _WRITING
                    return
            if waiting is _WRITING:  # another writer: the lease's own locker serializes
                return
            try:
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    await asyncio.wrap_future(waiting)
            except TimeoutError:
                return  # a renewal that hangs: write with what we know

    def take(self, lease: Any) -> bool:
        """:meth:`claim` without waiting: ``False``, with nothing claimed, if a renewal
        or another write of ``lease`` is in flight."""
        with self._guard:
            if lease._renewing is not None:
                return False
            lease._renewing = _WRITING
            return True

    def unclaim(self, lease: Any) -> None:
        """The write :meth:`claim` held the renewal off for is done."""
        with self._guard:
            if lease._renewing is _WRITING:
                lease._renewing = None

    def stop(self) -> None:
        """Stop renewing (the portal and the client are the caller's to stop). A renewal
        in flight finishes, so that a release waiting for it (see :meth:`claim`) learns
        its revision."""
        with self._guard:
            self._stopping = True
            self._leases.clear()
        self.portal.loop.call_soon_threadsafe(self._poke)

    def _begin(self) -> None:
        self._event = asyncio.Event()
        self._task = asyncio.ensure_future(self._run())

    def _poke(self) -> None:
        if self._event is not None:
            self._event.set()

    async def _run(self) -> None:
        assert self._event is not None
        while True:
            # Pokes run in this loop, only while this task awaits: none is lost between
            # this clear and the wait below.
            self._event.clear()
            with self._guard:
                if self._stopping:
                    return
                now = time.monotonic()
                leases = self._leases.items()
                due = [(lease, s) for lease, s in leases if s.due <= now + s.span / 6]
                if due:
                    self._wake_at = -math.inf  # adds during the round need no poke
                else:
                    self._wake_at = min((s.due for _, s in leases), default=now + self._idle)
                wait = self._wake_at - now
            if due:
                await asyncio.gather(*(self._renew(lease, schedule) for lease, schedule in due))
                continue
            try:
                async with asyncio.timeout(wait):
                    await self._event.wait()
            except TimeoutError:
                pass

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
        self.discard(lease)
        if not lease._released:
            _log.warning("lease %r lost: %s", lease.key, reason)
            self._on_lost(lease, reason)
