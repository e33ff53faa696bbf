"""The contract: what a backend implements and the only thing the scheduler uses.

Backends need not inherit from anything here: these are
:class:`typing.Protocol` classes, checked structurally. The base classes in
:mod:`multilock.backend` implement the fiddly common parts (idempotent release,
release shielded from cancellation, leak-free cancelled acquires) for backends
that want them.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, Self, runtime_checkable

from ._durations import Duration
from ._signal import LostSignal

if TYPE_CHECKING:
    from ._url import LockURL

__all__ = [
    "DEGRADED_STATES",
    "AsyncDistributedLock",
    "AsyncLease",
    "AsyncWatch",
    "Backend",
    "Capability",
    "ConformanceHooks",
    "DistributedLock",
    "Lease",
    "LockInfo",
    "SupportsAcquireManyStarted",
    "SupportsAsyncReleaseMany",
    "SupportsAsyncTickClaims",
    "SupportsClaimTicksStarted",
    "SupportsDegrade",
    "SupportsLocks",
    "SupportsReleaseMany",
    "SupportsReleaseStarted",
    "SupportsTickClaims",
    "SupportsWatchReleased",
    "TickTime",
]


class Capability(enum.StrEnum):
    """Promises a backend may declare; the conformance suite checks each one it declares."""

    FENCING = "fencing"
    """``Lease.fencing_token`` is an int, strictly increasing per name across holders."""
    TTL = "ttl"
    """Leases expire on the backend after their ttl unless extended."""
    RENEWAL = "renewal"
    """TTL leases are renewed automatically while held."""
    SESSION = "session"
    """Leases end when the holder's session (connection, process) ends."""
    CROSS_PROCESS = "cross-process"
    """Other processes on the same host see the lock."""
    CROSS_HOST = "cross-host"
    """Processes on other hosts see the lock."""
    LOST_SIGNAL = "lost-signal"
    """The backend can drop a held lease and then fires ``lease.lost``."""
    INTROSPECTION = "introspection"
    """The locker can list the locks currently held (``locks()``)."""
    BATCH = "batch"
    """``try_acquire_many`` takes any number of names in one round trip."""
    TICK_CLAIM = "tick-claim"
    """``claim_ticks`` raises a per-name high-water mark of fire times atomically (see
    :class:`SupportsTickClaims`): each fire time is won by one claimer only."""


@dataclass(frozen=True)
class LockInfo:
    """One lock currently held, as a backend with ``INTROSPECTION`` reports it."""

    key: str | int
    name: str | None = None
    """The lock name, where the backend can know it (advisory keys are one-way hashes)."""
    holder: str | None = None
    """Who holds it: pid, application name, client address, owner token..."""
    since: datetime | None = None
    expires_at: datetime | None = None
    details: Mapping[str, Any] = field(default_factory=dict)


class SupportsLocks(Protocol):
    """A locker that can list the locks held (backends declaring ``INTROSPECTION``)."""

    def locks(self) -> list[LockInfo]:
        """Every lock currently held on the backend that this locker can see."""


TickTime = datetime | float
"""A tick's fire time: an aware datetime, or epoch seconds (kept to the microsecond)."""


class SupportsTickClaims(Protocol):
    """A sync locker that can claim ticks (backends declaring ``TICK_CLAIM``).

    Each name has a *mark*, on the backend, apart from its lock: the latest fire time
    claimed. A claim of ``(name, F)`` raises the mark from below ``F`` to ``F`` in one
    atomic step and is won; it is lost when the mark is at ``F`` or beyond. So of every
    claimer of one tick -- whatever its clock says, however late it comes -- one wins,
    and a fire time older than one already claimed never wins.
    """

    @property
    def claim_retention(self) -> float | None:
        """Seconds a mark is kept after its last claim (``None``: as long as the
        backend's data is kept). A claim of a tick older than that may win again."""

    def claim_ticks(self, ticks: Mapping[str, TickTime]) -> Mapping[str, bool]:
        """Claim each ``(name, fire time)`` in one round trip where the backend can:
        ``True`` for the claims won, in order. Raises
        :class:`~multilock.errors.BackendUnavailable` when the backend cannot be asked."""

    def claim_tick(self, name: str, fire: TickTime) -> bool:
        """``claim_ticks`` of one tick: whether this call won ``(name, fire)``."""


class SupportsAsyncTickClaims(Protocol):
    """An async locker that can claim ticks: :class:`SupportsTickClaims`, awaited."""

    @property
    def claim_retention(self) -> float | None:
        """Seconds a mark is kept after its last claim (``None``: as long as the
        backend's data is kept)."""

    async def claim_ticks(self, ticks: Mapping[str, TickTime]) -> Mapping[str, bool]:
        """Claim each ``(name, fire time)``; ``True`` for the claims won, in order."""

    async def claim_tick(self, name: str, fire: TickTime) -> bool:
        """``claim_ticks`` of one tick: whether this call won ``(name, fire)``."""


class Lease(Protocol):
    """A held lock, from the sync API."""

    @property
    def name(self) -> str:
        """The lock name as given to ``try_acquire``."""

    @property
    def key(self) -> str | int:
        """The backend's key for the name (advisory key, Redis key, znode path...)."""

    @property
    def token(self) -> str:
        """An owner token unique to this acquisition."""

    @property
    def fencing_token(self) -> int | None:
        """Strictly increasing per name where the backend has ``FENCING``; else ``None``."""

    @property
    def expires_at(self) -> datetime | None:
        """When the lease ends unless extended (UTC); ``None`` for session-bound leases."""

    @property
    def lost(self) -> LostSignal:
        """Fires when the lease is lost while held."""

    @property
    def held(self) -> bool:
        """Neither released nor lost."""

    def extend(self, ttl: Duration | None = None) -> None:
        """Push the expiry ``ttl`` into the future; raise ``LockLost``/``NotOwner`` if gone."""

    def release(self) -> bool:
        """Release the lock; ``True`` if this call released it. Idempotent, never raises
        for a lease that was already released or lost."""

    def __enter__(self) -> Self: ...

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None: ...


class AsyncLease(Protocol):
    """A held lock, from the async API. Release is shielded from cancellation."""

    @property
    def name(self) -> str:
        """The lock name as given to ``try_acquire``."""

    @property
    def key(self) -> str | int:
        """The backend's key for the name."""

    @property
    def token(self) -> str:
        """An owner token unique to this acquisition."""

    @property
    def fencing_token(self) -> int | None:
        """Strictly increasing per name where the backend has ``FENCING``; else ``None``."""

    @property
    def expires_at(self) -> datetime | None:
        """When the lease ends unless extended (UTC); ``None`` for session-bound leases."""

    @property
    def lost(self) -> LostSignal:
        """Fires when the lease is lost while held; ``await lease.lost`` waits for it."""

    @property
    def held(self) -> bool:
        """Neither released nor lost."""

    async def extend(self, ttl: Duration | None = None) -> None:
        """Push the expiry ``ttl`` into the future; raise ``LockLost``/``NotOwner`` if gone."""

    async def release(self) -> bool:
        """Release the lock, even if the caller is being cancelled. Idempotent."""

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None: ...


class DistributedLock(Protocol):
    """A sync locker: takes leases on names (``try_acquire`` never waits for another
    holder; ``acquire`` does)."""

    @property
    def capabilities(self) -> frozenset[Capability]:
        """What this backend promises."""

    @property
    def url(self) -> str:
        """The lock URL, password masked."""

    def try_acquire(self, name: str, *, ttl: Duration | None = None) -> Lease | None:
        """A lease on ``name``, or ``None`` at once when someone else holds it.

        Raises :class:`~multilock.errors.BackendUnavailable` when the backend
        cannot be asked, never returns ``None`` for that.
        """

    def try_acquire_many(
        self, names: Iterable[str], *, ttl: Duration | None = None
    ) -> Mapping[str, Lease | None]:
        """``try_acquire`` for each name (in order); a lease or ``None`` per name."""

    def acquire(
        self, name: str, *, timeout: Duration | None = None, ttl: Duration | None = None
    ) -> Lease:
        """A lease on ``name``, waiting until it is free: at most ``timeout`` (``None``:
        as long as it takes; ``0``: one try), then
        :class:`~multilock.errors.LockTimeout`, leaving nothing held or queued."""

    def close(self) -> None:
        """Release every lease still held and close the connection."""

    def __enter__(self) -> Self: ...

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None: ...


class AsyncDistributedLock(Protocol):
    """An async locker: the same contract as :class:`DistributedLock`, awaited."""

    @property
    def capabilities(self) -> frozenset[Capability]:
        """What this backend promises."""

    @property
    def url(self) -> str:
        """The lock URL, password masked."""

    async def try_acquire(self, name: str, *, ttl: Duration | None = None) -> AsyncLease | None:
        """A lease on ``name``, or ``None`` at once when someone else holds it.

        A cancellation that lands while the acquire is in flight leaves no lock held.
        """

    async def try_acquire_many(
        self, names: Iterable[str], *, ttl: Duration | None = None
    ) -> Mapping[str, AsyncLease | None]:
        """``try_acquire`` for each name (in order); a lease or ``None`` per name."""

    async def acquire(
        self, name: str, *, timeout: Duration | None = None, ttl: Duration | None = None
    ) -> AsyncLease:
        """A lease on ``name``, waiting until it is free: at most ``timeout``, then
        :class:`~multilock.errors.LockTimeout`. A wait that times out or is cancelled
        leaves nothing held or queued."""

    async def aclose(self) -> None:
        """Release every lease still held and close the connection."""

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None: ...


# --- optional fast paths --------------------------------------------------------------
# The scheduler works with the contract above alone. A locker (or lease) that also
# implements one of these protocols opts in to a faster path; the scheduler checks
# each one once (``isinstance``), when it is given the locker, never by private name.


@runtime_checkable
class SupportsAcquireManyStarted(Protocol):
    """An async locker that can start ``try_acquire_many`` from a plain callback (the
    scheduler's loop timer), without a task: the round trip is sent (or queued on the
    client's own thread) during the call, and a future says how it went."""

    def try_acquire_many_started(
        self, names: Iterable[str], *, ttl: Duration | None = None
    ) -> asyncio.Future[Mapping[str, AsyncLease | None]] | None:
        """``try_acquire_many(names, ttl=ttl)``, started now.

        Called on the event loop's thread, maybe with no task running. Returns a
        future of that loop, maybe already done, settled with exactly what
        ``try_acquire_many`` would return (a lease or ``None`` per name, in order) or
        raise -- without anyone awaiting it: the operation makes progress on its own,
        and must end by a deadline of its own. Or returns ``None``, having sent and
        changed nothing, when it cannot start at once: the caller then awaits
        ``try_acquire_many``. Bad names or ttl may raise at once, before anything is
        sent. The caller never cancels the future; one that stops waiting for it
        still reads it and releases what it grants.
        """


@runtime_checkable
class SupportsClaimTicksStarted(Protocol):
    """An async locker that can start ``claim_ticks`` from a plain callback (the
    scheduler's loop timer), without a task: what :class:`SupportsAcquireManyStarted`
    is to ``try_acquire_many``."""

    def claim_ticks_started(
        self, ticks: Mapping[str, TickTime]
    ) -> asyncio.Future[Mapping[str, bool]] | None:
        """``claim_ticks(ticks)``, started now: a future of the running loop, maybe
        already done, settled with what ``claim_ticks`` would return or raise, making
        progress (to a deadline of its own) with nobody awaiting it. ``None``, having
        sent and changed nothing, when it cannot start at once: the caller then awaits
        ``claim_ticks``. Bad names or fire times may raise at once."""


@runtime_checkable
class SupportsReleaseStarted(Protocol):
    """An async lease whose release can be started from a plain callback (the
    scheduler ending a lease hold on a timer), without a task."""

    def release_started(self) -> asyncio.Future[bool] | None:
        """``release()``, started now: a future (of the running loop, maybe already
        done) settled with what ``await release()`` would return, or its error. The
        release makes progress without anyone awaiting the future, is finished even
        if nobody reads it, and ends by a deadline of its own. From this call on,
        ``held`` is false and ``release()`` answers ``False``, as after a release.
        ``None``, having sent and changed nothing, when the release cannot be started
        at once: the caller then awaits ``release()``."""


@runtime_checkable
class SupportsAsyncReleaseMany(Protocol):
    """An async locker that releases many of its leases at once (in one round trip
    where it can): the scheduler's lease holds end together."""

    async def release_many(self, leases: Sequence[AsyncLease]) -> None:
        """Release ``leases`` (all taken from this locker) as ``release()`` each
        would: every one of them is released (or, if the backend is unreachable, left
        to end with its session or ttl), already released ones are left alone, and
        each is no longer ``held`` once the call returns. Finishes even if the caller
        is cancelled meanwhile; the first error is raised after the rest are done."""


@runtime_checkable
class SupportsReleaseMany(Protocol):
    """A sync locker that releases many of its leases at once: what
    :class:`SupportsAsyncReleaseMany` is to an async one (a sync locker given to the
    scheduler is used through it)."""

    def release_many(self, leases: Sequence[Lease]) -> None:
        """Release ``leases`` (all taken from this locker) as ``release()`` each
        would; the first error is raised after the rest are done."""


class AsyncWatch(Protocol):
    """What a waiting acquire waits on between two tries (see
    :class:`SupportsWatchReleased`): an async context manager."""

    wakes: bool
    """Whether ``wait`` returns early when the name is released (it may change: a watch
    whose listening failed polls)."""

    async def wait(self, seconds: float) -> None:
        """Return after ``seconds``, or earlier when the name may have been released."""

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None: ...


@runtime_checkable
class SupportsWatchReleased(Protocol):
    """An async locker told when a name is released, so that who waits for the name
    (a waiting acquire, a follower of :func:`multilock.leadership`) tries again then
    instead of at its next poll."""

    def watch_released(self, name: str) -> AsyncWatch:
        """A watch on ``name``, entered before the first try.

        It listens from ``__aenter__``, or from its first ``wait``, which then returns
        at once, so that the next try is made listening: no release falls between a
        try and the listening. ``wait`` returns as soon as a release of the name is
        announced (a wake-up is a hint: the waiter tries again, and still polls for
        releases nobody announces). ``__aexit__`` leaves nothing behind (no
        subscription, no queued claim), even when the caller is cancelled. A watch
        that cannot listen sets ``wakes`` false and only sleeps.
        """


class ConformanceHooks(Protocol):
    """What the conformance suite needs to know of a backend beyond the contract.

    Stale holders need no hook: the suite freezes a holder *process* with
    SIGSTOP (which stops its renewal too, as a long GC pause would), lets the
    lease expire, hands the name to another locker, resumes the holder with
    SIGCONT and checks that its release and extend cannot touch the new holder.
    """

    def crash_release_bound(self, url: LockURL, ttl: float) -> float:
        """Seconds after a holder is SIGKILLed -- or frozen with SIGSTOP, for TTL
        backends -- by which the lock must be free again. ``ttl`` is the lease's
        (0.0 for backends without ``TTL``); the suite adds a second of slack."""

    def break_lease(self, url: LockURL, locker: object, lease: object) -> None:
        """Drop ``lease`` from the server side (kill its session, delete its key...),
        so that the backend notices and fires ``lease.lost``.

        Only called for backends that declare ``LOST_SIGNAL``. ``locker`` is the
        sync or async locker that holds ``lease``; the call is made from a worker
        thread while an async locker's event loop keeps running.
        """

    def unreachable_url(self, url: LockURL) -> str | None:
        """A URL of the same backend that cannot be reached, or ``None`` when the
        backend has no server (in-process), which the suite reports."""


DEGRADED_STATES = ("busy", "read-only", "refusing")
"""The states :meth:`SupportsDegrade.degraded` may put a backend in."""


@runtime_checkable
class SupportsDegrade(Protocol):
    """An optional conformance hook: conformance hooks that also have ``degraded`` let
    the suite check that a backend which is reachable but cannot answer raises
    :class:`~multilock.errors.BackendUnavailable` -- never ``None``, which means "held
    by another lease"."""

    def degraded(self, url: LockURL, state: str) -> AbstractContextManager[str | None]:
        """A context manager putting the backend of ``url`` into ``state`` (one of
        :data:`DEGRADED_STATES`: ``busy`` -- it answers too late; ``read-only`` -- it
        answers but refuses writes; ``refusing`` -- it refuses the client) for the
        block, yielding a URL at which a new locker meets that state, or ``None`` when
        the backend cannot be put in it. Called from a worker thread; everything it
        changed is undone when the block ends."""


class Backend(Protocol):
    """What an entry point of group ``multilock.backends`` resolves to.

    The entry point's name is the URL scheme. ``conformance`` may be ``None``
    when the backend ships no hooks: the suite then runs what needs none.
    """

    def connect(self, url: LockURL) -> DistributedLock:
        """A sync locker for ``url``."""

    def connect_async(self, url: LockURL) -> AsyncDistributedLock:
        """An async locker for ``url``."""

    @property
    def conformance(self) -> ConformanceHooks | None:
        """Hooks for the conformance suite, or ``None``."""
