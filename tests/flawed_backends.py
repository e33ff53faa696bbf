"""Deliberately broken backends, built on the kit, to prove the conformance suite bites.

Each URL scheme is one in-process backend with one flaw (``sound`` has none:
it is the control, a TTL backend that must pass the whole suite):

* ``reentrant``: a locker is granted a name it already holds (PostgreSQL's
  advisory locks are re-entrant per session: a backend must track its holds).
* ``blocking``: ``try_acquire`` waits for the holder instead of returning None.
* ``uncancellable``: the async release is not shielded, so a cancellation that
  lands while it is in flight leaves the lock held.
* ``blinddelete``: release deletes the key whoever holds it (no compare-and-delete).
* ``leaky``: an async acquire cancelled after the server granted it, while the
  reply is still on its way, drops the lease on the floor: the lock stays held.
* ``nohooks``: declares LOST_SIGNAL but ships no ConformanceHooks to prove it.
* ``impatient``: ``acquire`` tries once and gives up, whatever its timeout.
* ``queueing``: a waiting ``acquire`` that times out leaves its claim queued: the name
  goes to that locker when its holder releases it (an abandoned blocking ``flock``).

:func:`register` registers them all with :func:`multilock.register_backend`;
the plugin tests copy this module into their pytester directory.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import multilock
from multilock.backend import (
    AsyncLeaseBase,
    AsyncLockerBase,
    Capability,
    Duration,
    LeaseBase,
    LockerBase,
    LockURL,
    OptionParser,
    as_duration,
    new_token,
)
from multilock.errors import LockTimeout, NotOwner

__all__ = ["FLAWS", "FlawedBackend", "register"]

FLAWS = (
    "sound",
    "reentrant",
    "blocking",
    "uncancellable",
    "blinddelete",
    "leaky",
    "nohooks",
    "impatient",
    "queueing",
)
_OPTIONS = OptionParser({"ttl": as_duration}, {"ttl": 30.0})
_BLOCK_AT_MOST = 3.5  # a blocking try_acquire gives up eventually, so broken runs end


class _Table:
    """The lock table of one namespace: name -> (token, monotonic expiry, owning locker)."""

    def __init__(self) -> None:
        self.guard = threading.Lock()
        self.holders: dict[str, tuple[str, float, object]] = {}
        self.fences: dict[str, int] = {}
        self.queued: dict[str, object] = {}  # name -> the locker its release goes to

    def queue(self, name: str, owner: object) -> None:
        with self.guard:
            self.queued[name] = owner

    def take(self, name: str, ttl: float, owner: object, flaw: str) -> tuple[str, int] | None:
        with self.guard:
            now = time.monotonic()
            held = self.holders.get(name)
            if held is not None and held[1] > now:
                if flaw == "reentrant" and held[2] is owner:
                    return held[0], self.fences[name]
                return None
            token = new_token()
            self.fences[name] = fence = self.fences.get(name, 0) + 1
            self.holders[name] = (token, now + ttl, owner)
            return token, fence

    def drop(self, name: str, token: str, blind: bool) -> bool:
        with self.guard:
            held = self.holders.get(name)
            if held is None or (not blind and held[0] != token):
                return False
            del self.holders[name]
            claimant = self.queued.pop(name, None)
            if claimant is not None:  # handed over to a claim nobody will release
                self.fences[name] += 1
                self.holders[name] = (new_token(), float("inf"), claimant)
            return held[1] > time.monotonic()

    def extend(self, name: str, token: str, ttl: float) -> None:
        with self.guard:
            held = self.holders.get(name)
            if held is None or held[0] != token or held[1] <= time.monotonic():
                raise NotOwner(f"lease on {name!r} expired or is held by another owner")
            self.holders[name] = (token, time.monotonic() + ttl, held[2])


_tables: dict[str, _Table] = {}
_tables_guard = threading.Lock()


class _Common:
    flaw = "sound"

    def _setup(self, url: LockURL) -> float:
        values, _ = _OPTIONS.parse(url)
        self._declare()
        with _tables_guard:
            self.table = _tables.setdefault(f"{url.scheme}/{url.host}{url.path}", _Table())
        self.mine: set[Any] = set()
        return float(values["ttl"])

    def _grant(self, name: str, ttl: float, cls: type[Any]) -> Any:
        got = self.table.take(name, ttl, self, self.flaw)
        if got is None:
            return None
        lease = cls(
            name, name, got[0], got[1], ttl if Capability.TTL in self.capabilities else None
        )
        lease.ttl, lease.table, lease.flaw, lease.mine = ttl, self.table, self.flaw, self.mine
        self.mine.add(lease)
        return lease

    def _drop_all(self) -> None:
        for lease in list(self.mine):
            lease._released = True
            self.table.drop(lease.name, lease.token, blind=False)
        self.mine.clear()

    capabilities: frozenset[Capability]

    def _declare(self) -> None:
        """TTL for the flaws that need expiry; LOST_SIGNAL for the one without hooks."""
        caps = {Capability.FENCING, Capability.BATCH}
        if self.flaw in ("sound", "blinddelete"):
            caps.add(Capability.TTL)
        if self.flaw == "nohooks":
            caps.add(Capability.LOST_SIGNAL)
        self.capabilities = frozenset(caps)


def _drop(lease: Any) -> bool:
    lease.mine.discard(lease)
    return bool(lease.table.drop(lease.name, lease.token, blind=lease.flaw == "blinddelete"))


class _Lease(LeaseBase):
    __slots__ = ("flaw", "mine", "table", "ttl")
    flaw: str
    mine: set[Any]
    table: _Table
    ttl: float

    def _release(self) -> bool:
        return _drop(self)

    def _extend(self, ttl: float | None) -> float | None:
        self.table.extend(self.name, self.token, ttl or self.ttl)
        return ttl or self.ttl


class _AsyncLease(AsyncLeaseBase):
    __slots__ = ("flaw", "mine", "table", "ttl")
    flaw: str
    mine: set[Any]
    table: _Table
    ttl: float

    async def release(self) -> bool:
        if self.flaw != "uncancellable":
            return await super().release()
        if self._released:
            return False
        self._released = True
        await asyncio.sleep(0.005)  # the round trip, left exposed to cancellation
        return _drop(self)

    async def _release(self) -> bool:
        return _drop(self)

    async def _extend(self, ttl: float | None) -> float | None:
        self.table.extend(self.name, self.token, ttl or self.ttl)
        return ttl or self.ttl


class _Locker(_Common, LockerBase):
    def __init__(self, url: LockURL, flaw: str) -> None:
        self.flaw = flaw
        super().__init__(url, default_ttl=self._setup(url))

    def _try_acquire(self, name: str, ttl: float) -> LeaseBase | None:
        deadline = time.monotonic() + _BLOCK_AT_MOST
        while True:
            lease: LeaseBase | None = self._grant(name, ttl, _Lease)
            if lease is not None or self.flaw != "blocking" or time.monotonic() > deadline:
                return lease
            time.sleep(0.01)

    def acquire(
        self, name: str, *, timeout: Duration | None = None, ttl: Duration | None = None
    ) -> LeaseBase:
        """The kit's waiting acquire -- but ``impatient`` never waits, and ``queueing``
        leaves a claim behind when it times out."""
        if self.flaw == "impatient":
            lease = self.try_acquire(name, ttl=ttl)
            if lease is None:
                raise LockTimeout(f"{name!r} is held")
            return lease
        try:
            return super().acquire(name, timeout=timeout, ttl=ttl)
        except LockTimeout:
            if self.flaw == "queueing":
                self.table.queue(name, self)
            raise

    def _close(self) -> None:
        self._drop_all()


class _AsyncLocker(_Common, AsyncLockerBase):
    def __init__(self, url: LockURL, flaw: str) -> None:
        self.flaw = flaw
        super().__init__(url, default_ttl=self._setup(url))

    async def try_acquire(self, name: str, *, ttl: Duration | None = None) -> AsyncLeaseBase | None:
        """The kit's acquire -- except that ``leaky`` skips its undo-on-cancel."""
        if self.flaw != "leaky":
            return await super().try_acquire(name, ttl=ttl)
        return await self._try_acquire(self._check(name), self._ttl(ttl))

    async def _try_acquire(self, name: str, ttl: float) -> AsyncLeaseBase | None:
        deadline = time.monotonic() + _BLOCK_AT_MOST
        while True:
            lease: AsyncLeaseBase | None = self._grant(name, ttl, _AsyncLease)
            if self.flaw == "leaky":
                await asyncio.sleep(0.002)  # granted; the reply is still on the wire
            if lease is not None or self.flaw != "blocking" or time.monotonic() > deadline:
                return lease
            await asyncio.sleep(0.01)

    async def acquire(
        self, name: str, *, timeout: Duration | None = None, ttl: Duration | None = None
    ) -> AsyncLeaseBase:
        """As the sync locker's."""
        if self.flaw == "impatient":
            lease = await self.try_acquire(name, ttl=ttl)
            if lease is None:
                raise LockTimeout(f"{name!r} is held")
            return lease
        try:
            return await super().acquire(name, timeout=timeout, ttl=ttl)
        except LockTimeout:
            if self.flaw == "queueing":
                self.table.queue(name, self)
            raise

    async def _close(self) -> None:
        self._drop_all()


class _Hooks:
    def crash_release_bound(self, url: LockURL, ttl: float) -> float:
        return ttl

    def break_lease(self, url: LockURL, locker: object, lease: object) -> None:
        raise NotImplementedError("these backends cannot drop a lease")

    def unreachable_url(self, url: LockURL) -> str | None:
        return None


class FlawedBackend:
    """One backend per flaw (see the module docstring)."""

    def __init__(self, flaw: str) -> None:
        self.flaw = flaw
        self.conformance = None if flaw == "nohooks" else _Hooks()

    def connect(self, url: LockURL) -> _Locker:
        """A sync locker with this backend's flaw."""
        return _Locker(url, self.flaw)

    def connect_async(self, url: LockURL) -> _AsyncLocker:
        """An async locker with this backend's flaw."""
        return _AsyncLocker(url, self.flaw)


def register() -> None:
    """Register every flaw as a URL scheme of its own name."""
    for flaw in FLAWS:
        multilock.register_backend(flaw, FlawedBackend(flaw))
