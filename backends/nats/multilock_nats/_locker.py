"""The ``nats://`` lockers and leases, sync and async, on one set of flows.

nats-py is asyncio only, so the flows are written once, as coroutines over a
:class:`~multilock_nats._client.Client`: the async locker awaits them on its client in
the caller's loop; the sync locker runs them on its client in a portal (a loop in a
thread of its own) and waits for each. Both renew from a portal: the sync locker's own,
or, for the async locker, one it starts beside the caller's loop with a client of its
own -- so that a blocked caller's loop cannot starve the renewal. The async locker
sends an acquire or a release at once where it can, with no task (``_started``).
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import Future
from datetime import datetime
from typing import Any, TypeVar, cast

from multilock.abc import LockInfo
from multilock.backend import (
    AsyncLeaseBase,
    AsyncLockerBase,
    Capability,
    LeaseBase,
    LockerBase,
    LockURL,
    Outcome,
    new_token,
)
from multilock.errors import ConfigurationError, LockLost

from ._client import Client
from ._config import MIN_TTL, NatsConfig
from ._errors import NATS_ERRORS, translate
from ._keys import escape, unescape
from ._portal import Portal
from ._renewal import Renewer
from ._started import start_acquire, start_release

__all__ = ["AsyncNatsLease", "AsyncNatsLocker", "NatsLease", "NatsLocker"]

CAPABILITIES = frozenset(
    {
        Capability.TTL,
        Capability.RENEWAL,
        Capability.FENCING,
        Capability.LOST_SIGNAL,
        Capability.CROSS_PROCESS,
        Capability.CROSS_HOST,
        Capability.BATCH,
        Capability.INTROSPECTION,
    }
)
T = TypeVar("T")
_LEASE_SLOTS = ("_locker", "_rev", "_renewing", "_span", "_subject", "_token", "_ttl")


class _LeaseFields:
    """What both leases hold beyond the kit's (their ``__slots__`` store it)."""

    __slots__ = ()
    _subject: str
    _token: bytes
    _rev: int
    _ttl: float
    _span: float
    _renewing: Future[None] | object | None  # a renewal in flight, or a writer


class NatsLease(_LeaseFields, LeaseBase):
    """A lease on a NATS KV lock (sync API), renewed in the background while held.

    ``fencing_token`` is the revision (stream sequence) of the write that took the key.
    """

    __slots__ = _LEASE_SLOTS
    key: str
    fencing_token: int
    _locker: NatsLocker

    def _release(self) -> bool:
        return self._locker._release_lease(self)

    def _extend(self, ttl: float | None) -> float:
        return self._locker._extend_lease(self, self._ttl if ttl is None else ttl)


class AsyncNatsLease(_LeaseFields, AsyncLeaseBase):
    """A lease on a NATS KV lock (async API), renewed in the background while held.

    ``fencing_token`` is the revision (stream sequence) of the write that took the key.
    """

    __slots__ = _LEASE_SLOTS
    key: str
    fencing_token: int
    _locker: AsyncNatsLocker

    async def _release(self) -> bool:
        return await self._locker._release_lease(self)

    def _start_release(self) -> Outcome[bool] | None:
        locker = self._locker
        return start_release(locker, locker._client, locker._renewal(), self)

    async def _extend(self, ttl: float | None) -> float:
        return await self._locker._extend_lease(self, self._ttl if ttl is None else ttl)


L = TypeVar("L", NatsLease, AsyncNatsLease)


class _NatsCommon:
    """What both lockers share: the flows (coroutines over a client) and bookkeeping."""

    capabilities = CAPABILITIES
    # A subject must fit NATS's control line (4 KiB by default): an escaped byte takes 3.
    max_name_length: int | None = 1024
    _url: LockURL

    def _setup(self, url: LockURL) -> float:
        self._config = NatsConfig.from_url(url)
        self._held: set[Any] = set()
        return self._config.ttl

    def _call_limit(self) -> float:
        """How long a whole call may take: a connect and three requests, each bounded."""
        return self._config.connect_timeout + 3 * self._config.timeout + 1.0

    @property
    def bucket(self) -> str:
        """The KV bucket of this locker's locks."""
        return self._config.bucket

    def _subject(self, name: str) -> str:
        return self._config.subjects + self._config.prefix + escape(name)

    def _check_ttl(self, ttl: float) -> None:
        if ttl < MIN_TTL:
            raise ConfigurationError(f"ttl {ttl}s is too short for nats (at least {MIN_TTL}s)")

    async def _acquire_in(
        self, client: Client, names: list[str], ttl: float, cls: type[L]
    ) -> tuple[dict[str, L | None], float]:
        """Take ``names`` (concurrently, on one connection); the leases and the monotonic
        time the writes were sent. On an error nothing stays held."""
        self._check_ttl(ttl)
        batch = new_token()
        tokens = [batch] if len(names) == 1 else [f"{batch}.{i:x}" for i in range(len(names))]
        subjects = [self._subject(name) for name in names]
        start = time.monotonic()
        answers: list[int | BaseException | None]
        if len(names) == 1:  # no task to make: the common case
            try:
                answers = [await client.acquire(subjects[0], tokens[0].encode())]
            except NATS_ERRORS as exc:
                raise translate(exc, self._url, "acquiring") from None
        else:
            answers = await asyncio.gather(
                *(client.acquire(s, t.encode()) for s, t in zip(subjects, tokens, strict=True)),
                return_exceptions=True,
            )
        failed = next((a for a in answers if isinstance(a, BaseException)), None)
        if failed is not None:
            taken = [(s, a) for s, a in zip(subjects, answers, strict=True) if isinstance(a, int)]
            await asyncio.gather(*(client.release(s, a) for s, a in taken), return_exceptions=True)
            if isinstance(failed, NATS_ERRORS):
                raise translate(failed, self._url, "acquiring") from None
            raise failed
        span = min(ttl, client.max_age or ttl)
        result: dict[str, L | None] = dict.fromkeys(names)
        expires_at = None
        for name, subject, token, revision in zip(names, subjects, tokens, answers, strict=True):
            if isinstance(revision, int):
                lease = self._lease(cls, name, subject, token, revision, ttl, span, expires_at)
                expires_at = lease.expires_at  # granted together: one expiry serves them
                result[name] = lease
        return result, start

    def _lease(
        self,
        cls: type[L],
        name: str,
        subject: str,
        token: str,
        revision: int,
        ttl: float,
        span: float,
        expires_at: datetime | None = None,
    ) -> L:
        """The lease on ``name`` that the write of ``token`` at ``revision`` granted."""
        lease = cls(name, subject[len(self._config.subjects) :], token, revision, span,
                    expires_at=expires_at)  # fmt: skip
        lease._locker = self  # type: ignore[assignment]
        lease._subject, lease._token, lease._rev = subject, token.encode(), revision
        lease._ttl, lease._span, lease._renewing = ttl, span, None
        return lease

    def _track(self, renewer: Renewer, result: dict[str, Any], start: float) -> None:
        leases = [lease for lease in result.values() if lease is not None]
        if leases:
            self._held.update(leases)
            renewer.add(leases, start)

    async def _release_in(self, client: Client, renewer: Renewer, lease: Any) -> bool:
        self._held.discard(lease)
        renewer.discard(lease)
        await renewer.claim(lease)
        try:
            return await client.release(lease._subject, lease._rev)
        except NATS_ERRORS as exc:
            if lease.lost.is_set():
                return False  # already reported lost: its key expires on its own
            raise translate(exc, self._url, "releasing") from None
        finally:
            renewer.unclaim(lease)

    async def _extend_in(self, client: Client, renewer: Renewer, lease: Any, ttl: float) -> float:
        self._check_ttl(ttl)
        span = min(ttl, client.max_age or ttl)
        start = time.monotonic()
        await renewer.claim(lease)
        try:
            revision = await client.renew(
                lease._subject, lease._token, lease._rev, lease.fencing_token
            )
            if revision is not None:
                lease._rev = revision
        except NATS_ERRORS as exc:
            raise translate(exc, self._url, "extending") from None
        finally:
            renewer.unclaim(lease)
        if revision is None:
            reason = f"lock {lease.key!r} expired, was purged or taken on the server"
            self._lost(lease, reason)
            renewer.discard(lease)
            raise LockLost(f"cannot extend {lease.name!r}: {reason}")
        lease._ttl, lease._span = ttl, span
        renewer.confirmed(lease, start)
        return span

    async def _release_all_in(self, client: Client, renewer: Renewer) -> None:
        """Release every lease still held (a closing locker's)."""
        leases = list(self._held)
        self._held.clear()
        for lease in leases:
            lease._released = True
        renewer.stop()

        async def release(lease: Any) -> None:
            await renewer.claim(lease)
            try:
                await client.release(lease._subject, lease._rev)
            finally:
                renewer.unclaim(lease)

        # What cannot be released expires after the bucket's TTL.
        await asyncio.gather(*(release(lease) for lease in leases), return_exceptions=True)

    async def _locks_in(self, client: Client) -> list[LockInfo]:
        try:
            holders = await client.holders()
        except NATS_ERRORS as exc:
            raise translate(exc, self._url, "listing locks") from None
        prefix = self._config.prefix
        return [
            LockInfo(
                key=holder.key,
                name=unescape(holder.key[len(prefix) :]),
                holder=holder.token,
                expires_at=holder.expires,
                details={"fencing_token": holder.fence, "revision": holder.revision},
            )
            for holder in holders
        ]

    def _lost(self, lease: Any, reason: str) -> None:
        self._held.discard(lease)
        lease.lost.set(reason)


class NatsLocker(_NatsCommon, LockerBase):
    """The sync locker of ``nats://host:4222/bucket``: nats-py in a portal thread."""

    def __init__(self, url: LockURL) -> None:
        super().__init__(url, default_ttl=self._setup(url))
        self._renewer: Renewer | None = None

    def _in_portal(self) -> Renewer:
        if self._renewer is None:
            portal = Portal("multilock-nats")
            self._renewer = Renewer(portal, Client(self._config), self._lost)
        return self._renewer

    def _call(self, work: Any) -> Any:
        """Run ``work`` (a coroutine over the portal's client) and wait for it. Each of its
        requests is bounded; the wait only guards against a bug."""
        try:
            return self._in_portal().portal.call(work, self._call_limit())
        except TimeoutError as exc:
            raise translate(exc, self._url, "waiting for nats-py") from None

    def _call_started(self, start: Any, work: Any) -> Any:
        """:meth:`_call` of ``work`` (a coroutine function), unless ``start()`` (a started
        path, in the portal's loop) sends the request at once: then its outcome."""
        try:
            return self._in_portal().portal.call_started(start, work, self._call_limit())
        except TimeoutError as exc:
            raise translate(exc, self._url, "waiting for nats-py") from None

    def _try_acquire(self, name: str, ttl: float) -> LeaseBase | None:
        renewer = self._in_portal()
        lease: LeaseBase | None = self._call_started(
            lambda: start_acquire(self, renewer.client, renewer, name, ttl, NatsLease),
            lambda: self._acquire_one(renewer, name, ttl),
        )
        return lease

    async def _acquire_one(self, renewer: Renewer, name: str, ttl: float) -> NatsLease | None:
        result, start = await self._acquire_in(renewer.client, [name], ttl, NatsLease)
        self._track(renewer, result, start)
        return result[name]

    def _try_acquire_many(self, names: list[str], ttl: float) -> dict[str, LeaseBase | None]:
        if not names:
            return {}
        renewer = self._in_portal()
        result, start = self._call(self._acquire_in(renewer.client, names, ttl, NatsLease))
        self._track(renewer, result, start)
        return dict(result)

    def _release_lease(self, lease: NatsLease) -> bool:
        renewer = self._in_portal()
        return bool(
            self._call_started(
                lambda: start_release(self, renewer.client, renewer, lease),
                lambda: self._release_in(renewer.client, renewer, lease),
            )
        )

    def _extend_lease(self, lease: NatsLease, ttl: float) -> float:
        renewer = self._in_portal()
        return float(self._call(self._extend_in(renewer.client, renewer, lease, ttl)))

    def locks(self) -> list[LockInfo]:
        """Every lock held in this locker's bucket (under its prefix), by any holder."""
        locks: list[LockInfo] = self._call(self._locks_in(self._in_portal().client))
        return locks

    def _close(self) -> None:
        renewer, self._renewer = self._renewer, None
        if renewer is None:
            return
        portal, client = renewer.portal, renewer.client
        portal.stop(_closing(self._release_all_in(client, renewer), client))


class AsyncNatsLocker(_NatsCommon, AsyncLockerBase):
    """The async locker of ``nats://host:4222/bucket``: nats-py in the caller's loop,
    renewal in a thread of its own."""

    def __init__(self, url: LockURL) -> None:
        super().__init__(url, default_ttl=self._setup(url))
        self._client = Client(self._config)
        self._renewer: Renewer | None = None

    def _renewal(self) -> Renewer:
        if self._renewer is None:
            portal = Portal("multilock-nats-renewal")
            self._renewer = Renewer(portal, Client(self._config), self._lost)
        return self._renewer

    async def _try_acquire(self, name: str, ttl: float) -> AsyncLeaseBase | None:
        return (await self._try_acquire_many([name], ttl))[name]

    def _start_try_acquire(self, name: str, ttl: float) -> Outcome[AsyncLeaseBase | None] | None:
        started = start_acquire(self, self._client, self._renewal(), name, ttl, AsyncNatsLease)
        # An outcome of our leases is one of the kit's: Future is only invariant in name.
        return cast("Outcome[AsyncLeaseBase | None] | None", started)

    async def _try_acquire_many(
        self, names: list[str], ttl: float
    ) -> dict[str, AsyncLeaseBase | None]:
        if not names:
            return {}
        result, start = await self._acquire_in(self._client, names, ttl, AsyncNatsLease)
        self._track(self._renewal(), result, start)
        return dict(result)

    async def _release_lease(self, lease: AsyncNatsLease) -> bool:
        return await self._release_in(self._client, self._renewal(), lease)

    async def _extend_lease(self, lease: AsyncNatsLease, ttl: float) -> float:
        return await self._extend_in(self._client, self._renewal(), lease, ttl)

    async def locks(self) -> list[LockInfo]:
        """Every lock held in this locker's bucket (under its prefix), by any holder."""
        # Each read is bounded; the whole listing too, as the sync locker's call is.
        try:
            return await asyncio.wait_for(self._locks_in(self._client), self._call_limit())
        except TimeoutError as exc:
            raise translate(exc, self._url, "listing the locks") from None

    async def _close(self) -> None:
        renewer, self._renewer = self._renewer, None
        try:
            if renewer is not None:
                await self._release_all_in(self._client, renewer)
        finally:
            await self._client.close()
            if renewer is not None:
                await asyncio.to_thread(renewer.portal.stop, renewer.client.close())


async def _closing(release: Any, client: Client) -> None:
    try:
        await release
    finally:
        await client.close()
