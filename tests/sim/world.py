"""The simulated world: true time, the replicas' skewed clocks, and a lock server model.

Everything here moves only when the driver (``fleet.py``) sets the true time, so a
scenario runs in milliseconds and the same scenario always runs the same way. The
lock server is a model of the contract (``multilock.abc``), built on the backend
kit as a third-party backend would be, that keeps the history the invariants are
checked against: every grant of every name, when and how it ended, and every try.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from multilock.backend import AsyncLeaseBase, AsyncLockerBase, Capability, LockURL, Outcome
from multilock.errors import BackendUnavailable, LockLost

__all__ = [
    "Claim",
    "Grant",
    "Release",
    "ReplicaClock",
    "SimLease",
    "SimLocker",
    "SimTime",
    "Try",
    "World",
]

T = TypeVar("T")


class SimTime:
    """True time: it moves only when :meth:`advance_to` is called."""

    def __init__(self, start: float) -> None:
        self.now = start
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    async def sleep_until(self, deadline: float) -> None:
        """Wait until the true time reaches ``deadline`` (a scheduling point if it has)."""
        if deadline <= self.now:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (deadline, next(self._order), future))
        await future

    def next_deadline(self) -> float | None:
        """The earliest deadline someone still waits for."""
        sleepers = self._sleepers
        while sleepers and sleepers[0][2].done():  # cancelled waits
            heapq.heappop(sleepers)
        return sleepers[0][0] if sleepers else None

    def advance_to(self, when: float) -> None:
        """Move to ``when`` (never back) and wake whoever waits for it, earliest first."""
        self.now = max(self.now, when)
        sleepers = self._sleepers
        while sleepers and sleepers[0][0] <= self.now:
            _, _, future = heapq.heappop(sleepers)
            if not future.done():
                future.set_result(None)


class ReplicaClock:
    """A replica's clock (:class:`multilock.Clock`): true time plus a constant offset."""

    def __init__(self, time: SimTime, offset: float) -> None:
        self.time = time
        self.offset = offset

    def now(self) -> float:
        """True time plus the offset."""
        return self.time.now + self.offset

    async def sleep_until(self, deadline: float) -> None:
        """Wait until :meth:`now` reads ``deadline`` (to the last bit of the float)."""
        true = deadline - self.offset
        while true + self.offset < deadline:
            true = math.nextafter(true, math.inf)
        await self.time.sleep_until(true)


@dataclass
class Grant:
    """One lease of one name on the server, from its grant to its end."""

    token: int  # the fencing token: unique across names, increasing per name
    name: str
    owner: str
    granted_at: float
    ttl: float | None
    expires_at: float | None  # None: session-bound, or renewed by the backend
    ended_at: float | None = None
    end: str | None = None  # released, expired, revoked, crashed
    lease: SimLease | None = field(default=None, repr=False)


@dataclass(frozen=True)
class Try:
    """One acquire, as the server decided it."""

    at: float
    owner: str
    name: str
    token: int | None  # the grant, or None: refused
    holder: str | None  # who held the name when refused


@dataclass(frozen=True)
class Claim:
    """One tick claim, as the server decided it."""

    at: float
    owner: str
    name: str
    fire: int  # microseconds since the epoch
    won: bool


@dataclass(frozen=True)
class Release:
    """One release, from the moment it was sent to the server's answer."""

    token: int
    sent: float
    done: float


class World:
    """The lock server: names, their holders, expiry on true time, and the history.

    ``ttl``: leases expire unless extended (``renewal``: the backend extends them
    itself while their owner lives, as Redis's client does). Otherwise leases are
    session-bound: they end when their owner crashes. ``latency`` is one way: a
    request is decided ``latency`` after it is sent, and answered as long again.
    """

    def __init__(
        self, time: SimTime, *, ttl: bool, renewal: bool, latency: float, claims: bool = False
    ) -> None:
        self.time = time
        self.claims = claims  # TICK_CLAIM: a mark per name, raised by claims
        self.marks: dict[str, int] = {}
        self.claim_log: list[Claim] = []
        self.ttl = ttl
        self.renewal = renewal
        self.latency = latency
        self.holders: dict[str, Grant] = {}
        self.grants: dict[int, Grant] = {}
        self.tries: list[Try] = []
        self.releases: list[Release] = []
        self.dead: set[str] = set()
        self._tokens = itertools.count(1)

    @property
    def capabilities(self) -> frozenset[Capability]:
        """What the modelled backend declares."""
        common = {Capability.FENCING, Capability.LOST_SIGNAL, Capability.BATCH}
        if self.claims:
            common.add(Capability.TICK_CLAIM)
        if not self.ttl:
            return frozenset(common | {Capability.SESSION})
        return frozenset(
            common | {Capability.TTL} | ({Capability.RENEWAL} if self.renewal else set())
        )

    def acquire(self, owner: str, name: str, ttl: float) -> Grant | None:
        """Decide an acquire now."""
        if owner in self.dead:
            raise BackendUnavailable(f"{owner} is gone")
        holder = self.holders.get(name)
        if holder is not None:
            self.tries.append(Try(self.time.now, owner, name, None, holder.owner))
            return None
        expires = self.time.now + ttl if self.ttl and not self.renewal else None
        grant = Grant(next(self._tokens), name, owner, self.time.now, ttl, expires)
        self.holders[name] = self.grants[grant.token] = grant
        self.tries.append(Try(self.time.now, owner, name, grant.token, None))
        return grant

    def claim(self, owner: str, name: str, fire: int) -> bool:
        """Decide a tick claim now: raise the mark of ``name`` to ``fire`` if below."""
        if owner in self.dead:
            raise BackendUnavailable(f"{owner} is gone")
        won = self.marks.get(name, -1 << 62) < fire
        if won:
            self.marks[name] = fire
        self.claim_log.append(Claim(self.time.now, owner, name, fire, won))
        return won

    def release(self, grant: Grant) -> bool:
        """Compare-and-delete, decided now; a dead owner's request never arrives."""
        if grant.owner in self.dead or self.holders.get(grant.name) is not grant:
            return False
        self._end(grant, "released")
        return True

    def extend(self, grant: Grant, ttl: float) -> None:
        """Push a live grant's expiry ``ttl`` ahead, or raise :class:`LockLost`."""
        if grant.owner in self.dead:
            raise BackendUnavailable(f"{grant.owner} is gone")
        if self.holders.get(grant.name) is not grant:
            raise LockLost(f"lease on {grant.name!r} is gone ({grant.end})")
        grant.ttl = ttl
        if grant.expires_at is not None:
            grant.expires_at = self.time.now + ttl

    def revoke(self, name: str, reason: str) -> Grant | None:
        """Take ``name`` from its holder, as a server-side loss would; its ``lost`` fires."""
        grant = self.holders.get(name)
        if grant is not None:
            self._end(grant, "revoked", reason)
        return grant

    def crash(self, owner: str) -> None:
        """``owner`` dies: session-bound leases end now, TTL leases when they expire."""
        self.dead.add(owner)
        for grant in [g for g in self.holders.values() if g.owner == owner]:
            if not self.ttl:
                self._end(grant, "crashed")
            elif grant.expires_at is None:  # nobody renews it any more
                grant.expires_at = self.time.now + (grant.ttl or 0.0)

    def next_expiry(self) -> float | None:
        """When the next held lease expires."""
        return min(
            (g.expires_at for g in self.holders.values() if g.expires_at is not None),
            default=None,
        )

    def expire_due(self) -> None:
        """End the leases whose expiry has come."""
        for grant in [g for g in self.holders.values() if g.expires_at is not None]:
            if grant.expires_at is not None and grant.expires_at <= self.time.now:
                self._end(grant, "expired", "the lease expired")

    def held_by(self, owner: str) -> list[Grant]:
        """The grants ``owner`` holds now."""
        return [g for g in self.holders.values() if g.owner == owner]

    def _end(self, grant: Grant, how: str, reason: str | None = None) -> None:
        del self.holders[grant.name]
        grant.ended_at, grant.end = self.time.now, how
        if reason is not None and grant.lease is not None:
            grant.lease.lost.set(reason)


class SimLease(AsyncLeaseBase):
    """A lease of the modelled backend."""

    __slots__ = ("grant", "locker")

    def __init__(self, grant: Grant, locker: SimLocker) -> None:
        super().__init__(grant.name, grant.name, f"{grant.owner}-{grant.token}", grant.token)
        self.grant = grant
        self.locker = locker
        grant.lease = self

    async def _release(self) -> bool:
        return await self.locker._round_trip(lambda: self.locker._release_now(self))

    def _start_release(self) -> Outcome[bool] | None:
        if not self.locker.fast:
            return None
        return self.locker._started(lambda: self.locker._release_now(self))

    async def _extend(self, ttl: float | None) -> float | None:
        world, grant = self.locker.world, self.grant
        seconds = ttl if ttl is not None else grant.ttl or self.locker.default_ttl
        await self.locker._round_trip(lambda: world.extend(grant, seconds))
        return grant.ttl if world.ttl else None


class SimLocker(AsyncLockerBase):
    """One process's connection to the modelled server (``owner`` names the process).

    ``fast``: the backend starts requests at once (the kit's ``_start_*`` hooks, as
    memory://, PostgreSQL and Redis do); otherwise the kit runs them in tasks.
    """

    def __init__(self, world: World, owner: str, *, fast: bool) -> None:
        super().__init__(LockURL.parse(f"sim://{owner}"), default_ttl=30.0)
        self.world = world
        self.owner = owner
        self.fast = fast
        self.capabilities = world.capabilities

    async def _try_acquire(self, name: str, ttl: float) -> AsyncLeaseBase | None:
        return await self._round_trip(lambda: self._grant(name, ttl))

    async def _try_acquire_many(
        self, names: list[str], ttl: float
    ) -> dict[str, AsyncLeaseBase | None]:
        return await self._round_trip(lambda: {name: self._grant(name, ttl) for name in names})

    def _start_try_acquire_many(
        self, names: list[str], ttl: float
    ) -> Outcome[dict[str, AsyncLeaseBase | None]] | None:
        if not self.fast:
            return None
        return self._started(lambda: {name: self._grant(name, ttl) for name in names})

    async def _claim_ticks(self, names: list[str], fires: list[int]) -> list[bool]:
        return await self._round_trip(self._claims(names, fires))

    def _start_claim_ticks(self, names: list[str], fires: list[int]) -> Outcome[list[bool]] | None:
        return self._started(self._claims(names, fires)) if self.fast else None

    def _claims(self, names: list[str], fires: list[int]) -> Callable[[], list[bool]]:
        world, owner = self.world, self.owner
        return lambda: [world.claim(owner, n, f) for n, f in zip(names, fires, strict=True)]

    async def _close(self) -> None:
        for grant in self.world.held_by(self.owner):
            self.world.release(grant)

    def _grant(self, name: str, ttl: float) -> AsyncLeaseBase | None:
        grant = self.world.acquire(self.owner, name, ttl)
        return None if grant is None else SimLease(grant, self)

    def _release_now(self, lease: SimLease) -> bool:
        now, latency = self.world.time.now, self.world.latency
        self.world.releases.append(Release(lease.grant.token, now - latency, now + latency))
        return self.world.release(lease.grant)

    async def _round_trip(self, decide: Callable[[], T]) -> T:
        time, latency = self.world.time, self.world.latency
        if latency:
            await time.sleep_until(time.now + latency)
        answer = decide()
        if latency:
            await time.sleep_until(time.now + latency)
        return answer

    def _started(self, decide: Callable[[], T]) -> Outcome[T]:
        outcome: Outcome[T] = Outcome()
        if not self.world.latency:
            _settle(outcome, decide)  # answered at once, as memory:// does
            return outcome
        outcome.task = asyncio.ensure_future(self._settle_later(outcome, decide))
        return outcome

    async def _settle_later(self, outcome: Outcome[T], decide: Callable[[], T]) -> None:
        try:
            outcome.set_result(await self._round_trip(decide))
        except Exception as exc:
            outcome.set_exception(exc)


def _settle(outcome: Outcome[T], decide: Callable[[], T]) -> None:
    try:
        outcome.set_result(decide())
    except Exception as exc:
        outcome.set_exception(exc)
