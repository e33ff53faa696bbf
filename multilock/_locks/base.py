"""Base classes for backends: the parts of the contract that are the same everywhere.

A backend subclasses :class:`LockerBase`/:class:`AsyncLockerBase` and
:class:`LeaseBase`/:class:`AsyncLeaseBase` and fills in the underscored
methods. What the bases guarantee, so that no backend has to get it right
again: names and ttls validated one way, ``release()`` idempotent,
async release finished even when the caller is cancelled, and an async
acquire interrupted by cancellation undone once the server has answered.

An async backend whose client sends a request the moment it is called (its
own thread does the I/O) may also implement ``_start_try_acquire`` and
``_start_release``: they start the operation at once and return an
:class:`Outcome`, which the base awaits with no task of its own and which the
caller's cancellation cannot cut short. Those that don't keep the task path
(``_try_acquire``, ``_release``).

The bases implement the optional fast paths of :mod:`multilock.abc` on top of those
hooks (``try_acquire_many_started``, ``release_started``, ``release_many``,
``watch_released``): a backend overrides ``_start_*``, ``_release_leases`` or
``watch_released`` and the scheduler finds them.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import math
import os
import random
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import Self, TypeVar

from .._durations import MAX_DURATION, Duration, parse_duration
from .._signal import LostSignal
from .._url import LockURL
from ..abc import AsyncLease, Capability, LockInfo, TickTime
from ..errors import ConfigurationError, InvalidLockName, LockLost, LockTimeout, MultilockError
from .holds import AsyncHold, Hold
from .outcome import Outcome, finish_shielded, in_task, undo_on_cancel, wait_finished

__all__ = [
    "MAX_NAME_BYTES",
    "AsyncLeaseBase",
    "AsyncLockerBase",
    "AsyncReleaseWatch",
    "LeaseBase",
    "LockInfo",
    "LockerBase",
    "Patience",
    "ReleaseWatch",
    "check_name",
    "new_token",
    "tick_micros",
]

T = TypeVar("T")
_counter = itertools.count()


def _token_prefix() -> str:
    return f"{os.getpid():x}-{os.urandom(8).hex()}-"


# Drawn once per process: a forked child draws its own at once (register_at_fork
# below), so new_token() need not look at the pid on every call.
_prefix = _token_prefix()


def _redraw_prefix() -> None:
    global _prefix
    _prefix = _token_prefix()


os.register_at_fork(after_in_child=_redraw_prefix)


def new_token() -> str:
    """An owner token unique per acquisition across processes and hosts.

    Random per process (re-drawn after fork), then a counter: cheaper than a
    ``uuid4`` per acquisition on the hot path, and as unique.
    """
    return f"{_prefix}{next(_counter):x}"


def _expiry(ttl: float | None) -> datetime | None:
    return None if ttl is None else datetime.now(UTC) + timedelta(seconds=ttl)


class _LeaseState:
    """What both lease bases share: identity, expiry, the lost signal."""

    __slots__ = ("_released", "expires_at", "fencing_token", "key", "lost", "name", "token")
    max_ttl: float = MAX_DURATION
    """The longest ttl ``extend()`` accepts (a backend with a lower limit sets its own)."""

    def __init__(
        self,
        name: str,
        key: str | int,
        token: str,
        fencing_token: int | None = None,
        ttl: float | None = None,
        *,
        expires_at: datetime | None = None,
    ) -> None:
        # ``expires_at`` instead of ``ttl``: a backend that granted a batch at one
        # instant computes its expiry once, not per lease (about 1 us each).
        self.name = name
        self.key = key
        self.token = token
        self.fencing_token = fencing_token
        if expires_at is None and ttl is not None:
            expires_at = _expiry(ttl)
        self.expires_at = expires_at
        self.lost = LostSignal()
        self._released = False

    @property
    def held(self) -> bool:
        """Neither released nor lost."""
        return not self._released and not self.lost.is_set()

    def _check_extendable(self) -> None:
        if self._released:
            raise LockLost(f"lease on {self.name!r} was released")
        if self.lost.is_set():
            raise LockLost(f"lease on {self.name!r} was lost: {self.lost.reason}")

    def _set_expiry(self, ttl: float | None) -> None:
        self.expires_at = _expiry(ttl)

    def _extend_ttl(self, ttl: Duration | None) -> float | None:
        """``extend()``'s ttl checked, before the lease or the server is asked anything."""
        seconds = None if ttl is None else parse_duration(ttl, what="ttl", maximum=self.max_ttl)
        self._check_extendable()
        return seconds

    def __repr__(self) -> str:
        state = "released" if self._released else ("lost" if self.lost.is_set() else "held")
        fence = "" if self.fencing_token is None else f" fencing_token={self.fencing_token}"
        return f"<{type(self).__name__} {self.name!r} key={self.key!r}{fence} {state}>"


class LeaseBase(_LeaseState):
    """Sync lease base: implement ``_release()`` and ``_extend(ttl)``."""

    def release(self) -> bool:
        """Release the lock; ``True`` if this call released it. Idempotent."""
        if self._released:
            return False
        self._released = True
        # Even a lease reported lost is released on the backend: "lost" may mean
        # "could not be confirmed", and _release() is a compare-and-delete anyway.
        return self._release()

    # Generated from AsyncLeaseBase by scripts/async_to_sync.py: edit that class and rerun.
    __slots__ = ()

    def extend(self, ttl: Duration | None = None) -> None:
        """Push the expiry ``ttl`` (default: the acquire ttl) into the future."""
        self._set_expiry(self._extend(self._extend_ttl(ttl)))

    def _release(self) -> bool:
        raise NotImplementedError

    def _extend(self, ttl: float | None) -> float | None:
        """Extend on the backend; return the new ttl (``None``: session-bound)."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


class AsyncLeaseBase(_LeaseState):
    """Async lease base: implement ``async _release()`` and ``async _extend(ttl)``."""

    __slots__ = ()

    # sync-by-hand: the async release is shielded from the caller's cancellation
    async def release(self) -> bool:
        """Release the lock even when the caller is being cancelled. Idempotent."""
        if self._released:
            return False
        self._released = True
        started = self._start_release()
        return await wait_finished(in_task(self._release()) if started is None else started)

    # async-only: an Outcome is an asyncio future
    def release_started(self) -> Outcome[bool] | None:
        """:meth:`release` for a caller that cannot await (the scheduler ending a lease
        hold from a timer): the release starts now and its :class:`Outcome` is returned
        (:class:`~multilock.abc.SupportsReleaseStarted`). ``None``, with nothing done,
        when the backend has no ``_start_release`` (await :meth:`release` then), or
        when the lease was released already (``release()`` answers ``False``)."""
        if self._released:
            return None
        self._released = True
        started = self._start_release()
        if started is None:
            self._released = False  # nothing was sent: release() still has to
        return started

    async def extend(self, ttl: Duration | None = None) -> None:
        """Push the expiry ``ttl`` (default: the acquire ttl) into the future."""
        self._set_expiry(await self._extend(self._extend_ttl(ttl)))

    async def _release(self) -> bool:
        raise NotImplementedError

    # async-only
    def _start_release(self) -> Outcome[bool] | None:
        """Optional: send the release now and return the :class:`Outcome` of what
        ``_release()`` would return; ``None``: use ``_release()`` (in a task)."""
        return None

    async def _extend(self, ttl: float | None) -> float | None:
        """Extend on the backend; return the new ttl (``None``: session-bound)."""
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.release()


MAX_NAME_BYTES = 64 * 1024
"""The longest lock name any backend takes, in UTF-8 bytes (a backend may take fewer)."""


def check_name(name: object, limit: int | None = None, scheme: str = "") -> str:
    """``name`` if it is a lock name: text, valid Unicode, at most ``limit`` (and never
    more than :data:`MAX_NAME_BYTES`) UTF-8 bytes; else :class:`InvalidLockName`."""
    if not isinstance(name, str):
        raise InvalidLockName(f"a lock name must be a str, not {type(name).__name__}")
    limit = MAX_NAME_BYTES if limit is None else min(limit, MAX_NAME_BYTES)
    # An ASCII string (a flag of the string, read without encoding) is valid UTF-8 of one
    # byte a character; any other is counted without encoding where the length alone
    # proves it short (4 bytes a character at most).
    one_byte = name.isascii()
    if len(name) * (1 if one_byte else 4) > limit:
        size = len(name) if one_byte else len(name.encode("utf-8", "surrogatepass"))
        if size > limit:
            where = f" for {scheme}://" if scheme else ""
            raise InvalidLockName(
                f"lock name of {size} bytes is too long{where} (at most {limit} UTF-8 bytes)"
            )
    if not one_byte:
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidLockName(f"lock name {_shown(name)} is not valid Unicode text") from None
    return name


def _settle_claims(
    claimed: asyncio.Future[Mapping[str, bool]], names: list[str], done: asyncio.Future[list[bool]]
) -> None:
    """Settle ``claimed`` with what the started claims of ``names`` ended in."""
    error = done.exception()
    if error is not None:
        claimed.set_exception(error)
    else:
        claimed.set_result(dict(zip(names, done.result(), strict=True)))


def _shown(name: str) -> str:
    """``name`` for an error message: cut to a readable length."""
    return repr(name) if len(name) <= 80 else f"{name[:60]!r}... ({len(name)} characters)"


_TICK_CLAIM = Capability.TICK_CLAIM  # per claim: a member read off its class costs more (3.11)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def tick_micros(fire: object) -> int:
    """A tick's fire time (an aware datetime, or epoch seconds) as whole microseconds
    since the epoch: what a claim mark stores, exact and alike on every replica."""
    if isinstance(fire, datetime):
        if fire.tzinfo is None:
            raise ConfigurationError(
                f"the fire time {fire.isoformat()} has no timezone: give an aware datetime"
            )
        # The timedelta's own fields, not ``// timedelta(microseconds=1)``: as exact,
        # without the division's conversions (per claim, per tick).
        since = fire - _EPOCH
        return (since.days * 86_400 + since.seconds) * 1_000_000 + since.microseconds
    if isinstance(fire, int | float) and not isinstance(fire, bool) and math.isfinite(fire):
        return round(fire * 1_000_000)
    raise ConfigurationError(
        f"invalid fire time {fire!r}: expected an aware datetime or epoch seconds"
    )


FIRST_WAIT = 0.005
"""Seconds a waiting acquire first waits between two tries (then twice as long each time)."""
POLL_CAP = 0.25
"""The longest wait between two tries of a backend that is not woken by releases."""
WAKE_CAP = 2.0
"""The longest wait between two tries of a backend woken by releases: its safety net for
the releases nobody announces (a ttl that ran out, a holder that died)."""


def parse_timeout(timeout: object) -> float | None:
    """``acquire()``'s timeout in seconds: ``None`` (wait as long as it takes), ``0`` (one
    try) or a duration, checked before any server is asked."""
    if timeout is None:
        return None
    if not isinstance(timeout, bool) and isinstance(timeout, int | float) and timeout == 0:
        return 0.0
    if isinstance(timeout, timedelta) and timeout == timedelta(0):
        return 0.0
    try:
        return parse_duration(timeout, what="timeout")
    except ConfigurationError:
        if isinstance(timeout, int | float) and timeout < 0:
            raise ConfigurationError(f"invalid timeout: {timeout!r} is negative") from None
        raise


class Patience:
    """The clock of one waiting acquire: its deadline and its jittered, capped backoff.

    ``next_wait()`` gives how long to wait before the next try (at most until the
    deadline) or raises :class:`~multilock.errors.LockTimeout` once the deadline has
    passed. The waits start at :data:`FIRST_WAIT`, double up to the cap, and each is
    drawn between half and all of its step, so that waiters woken together spread out.
    """

    __slots__ = ("_deadline", "_limit", "_name", "_step")

    def __init__(self, name: str, timeout: object) -> None:
        self._name = name
        self._limit = parse_timeout(timeout)
        self._deadline = None if self._limit is None else time.monotonic() + self._limit
        self._step = FIRST_WAIT

    def next_wait(self, wakes: bool = False) -> float:
        """Seconds to wait before the next try (capped at :data:`WAKE_CAP` when ``wakes``,
        the watch being woken by releases, else :data:`POLL_CAP`); :class:`LockTimeout`
        past the deadline."""
        wait = random.uniform(self._step / 2, self._step)
        self._step = min(self._step * 2, WAKE_CAP if wakes else POLL_CAP)
        if self._deadline is None:
            return wait
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise LockTimeout(
                f"lock {_shown(self._name)} stayed held for the whole timeout ({self._limit:g} s)"
            )
        return min(wait, left)


class AsyncReleaseWatch:
    """What a waiting acquire waits on between two tries (``watch_released``).

    This one only sleeps: the kit then polls with backoff. A backend told of releases
    returns its own, which listens from before a try -- from ``__aenter__`` (before the
    first try), or from its first ``wait``, which then returns at once so that the
    next try is made listening: no release falls between a try and the listening --
    and returns from ``wait`` as soon as a release of the name is announced. Wake-ups
    are hints: the acquire always tries again, and keeps polling at :data:`WAKE_CAP`
    for releases nobody announces. ``__aexit__`` must leave nothing behind (no
    subscription, no queued claim), even when the caller is cancelled.
    """

    wakes = False
    """Whether ``wait`` returns early when the name is released (it may change: a watch
    whose listening failed polls)."""

    # sync-by-hand: the sync watch sleeps with time.sleep
    async def wait(self, seconds: float) -> None:
        """Return after ``seconds``, or earlier when the name may have been released."""
        await asyncio.sleep(seconds)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None


class ReleaseWatch:
    """What a waiting acquire waits on between two tries (sync API; see
    :class:`AsyncReleaseWatch`)."""

    def wait(self, seconds: float) -> None:
        """Return after ``seconds``, or earlier when the name may have been released."""
        time.sleep(seconds)

    # Generated from AsyncReleaseWatch by scripts/async_to_sync.py: edit that class and rerun.
    wakes = False

    """Whether ``wait`` returns early when the name is released (it may change: a watch
    whose listening failed polls)."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None


class _LockerCommon:
    capabilities: frozenset[Capability] = frozenset()
    claim_retention: float | None = None
    """Seconds a tick claim's mark is kept after its last claim (``None``: as long as the
    backend keeps its data); only meaningful with ``TICK_CLAIM``."""
    max_name_length: int | None = None  # in UTF-8 bytes, where the backend has a limit
    max_ttl: float = MAX_DURATION  # in seconds; a backend with a lower limit sets its own

    def __init__(self, url: LockURL, *, default_ttl: float) -> None:
        self._url = url
        self.default_ttl = parse_duration(default_ttl, what="default ttl", maximum=self.max_ttl)
        self._closed = False

    @property
    def url(self) -> str:
        """The lock URL, password masked."""
        return self._url.masked

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called."""
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise MultilockError(f"{self!r} is closed")

    def _check(self, name: object) -> str:
        self._check_open()
        return check_name(name, self.max_name_length, self._url.scheme)

    def _ttl(self, ttl: Duration | None) -> float:
        """The acquire's ttl, checked (at most ``max_ttl``) before any server is asked."""
        if ttl is None:
            return self.default_ttl
        return parse_duration(ttl, what="ttl", maximum=self.max_ttl)

    def _names(self, names: Iterable[str]) -> list[str]:
        # _check()'s checks, its lookups made once per batch: asked per tick by the scheduler
        limit, scheme = self.max_name_length, self._url.scheme
        checked = [check_name(name, limit, scheme) for name in names]
        if checked:
            self._check_open()
        if len(checked) > 1 and len(set(checked)) != len(checked):
            raise InvalidLockName("try_acquire_many was given the same name twice")
        return checked

    def _ticks(self, ticks: Mapping[str, TickTime]) -> tuple[list[str], list[int]]:
        """``claim_ticks``'s names and fire times (in microseconds), checked before any
        server is asked; :class:`MultilockError` on a backend without ``TICK_CLAIM``."""
        if _TICK_CLAIM not in self.capabilities:
            raise MultilockError(
                f"{self._url.scheme}:// does not declare Capability.TICK_CLAIM: it cannot claim"
                " ticks (hold the lock instead)"
            )
        names = self._names(ticks)
        return names, [tick_micros(ticks[name]) for name in names]

    def __repr__(self) -> str:
        state = " closed" if self._closed else ""
        return f"<{type(self).__name__} {self.url}{state}>"


class LockerBase(_LockerCommon):
    """Sync locker base: implement ``_try_acquire`` and ``_close``."""

    def try_acquire(self, name: str, *, ttl: Duration | None = None) -> LeaseBase | None:
        """A lease on ``name``, or ``None`` at once when someone else holds it."""
        return self._try_acquire(self._check(name), self._ttl(ttl))

    def try_acquire_many(
        self, names: Iterable[str], *, ttl: Duration | None = None
    ) -> dict[str, LeaseBase | None]:
        """A lease or ``None`` per name, in order. On error, nothing stays held."""
        return self._try_acquire_many(self._names(names), self._ttl(ttl))

    def hold(
        self,
        name: str,
        *,
        at_least: Duration | None = None,
        at_most: Duration | None = None,
        since: datetime | float | None = None,
    ) -> Hold:
        """``with locker.hold(name, at_least=..., at_most=...) as lease``: ShedLock's
        lock-at-least / lock-at-most-for (see :func:`multilock.hold`)."""
        return Hold(self, name, at_least=at_least, at_most=at_most, since=since)

    def close(self) -> None:
        """Release every lease still held and close the connection. Idempotent."""
        if not self._closed:
            self._closed = True
            self._close()

    def release_many(self, leases: Sequence[LeaseBase]) -> None:
        """Release ``leases`` (all of this locker) as ``release()`` each would, in one
        round trip where the backend overrides ``_release_leases``: for the scheduler,
        whose lease holds end together (:class:`~multilock.abc.SupportsReleaseMany`).
        The first error is raised after the rest."""
        pending = [lease for lease in leases if not lease._released]
        for lease in pending:
            lease._released = True
        self._release_leases(pending)

    # Generated from AsyncLockerBase by scripts/async_to_sync.py: edit that class and rerun.
    def acquire(
        self, name: str, *, timeout: Duration | None = None, ttl: Duration | None = None
    ) -> LeaseBase:
        """A lease on ``name``, waiting until it is free: at most ``timeout`` (``None``:
        as long as it takes; ``0``: one try), then :class:`~multilock.errors.LockTimeout`.

        Woken by the release where the backend can tell (``watch_released``), else
        polling with jittered backoff. A wait that times out or is cancelled leaves
        nothing held and nothing queued.
        """
        checked, seconds = self._check(name), self._ttl(ttl)
        patience = Patience(checked, timeout)
        lease = None
        try:
            with self.watch_released(checked) as watch:
                while (lease := self.try_acquire(checked, ttl=seconds)) is None:
                    watch.wait(patience.next_wait(watch.wakes))
        except BaseException:
            # Granted, then interrupted while the watch closed (a cancellation landing
            # in its __aexit__): nobody will have the lease, so nobody may keep the lock.
            if lease is not None:
                lease.release()
            raise
        return lease

    def watch_released(self, name: str) -> ReleaseWatch:
        """Optional: a watch woken when ``name`` is released (see :class:`AsyncReleaseWatch`
        and :class:`~multilock.abc.SupportsWatchReleased`). By default one that only
        sleeps: the waiting acquire polls."""
        return ReleaseWatch()

    def claim_ticks(self, ticks: Mapping[str, TickTime]) -> dict[str, bool]:
        """Claim each ``(name, fire time)`` (backends declaring ``TICK_CLAIM``): ``True``
        for the claims won, in order -- the name's mark was below the fire time and is
        now at it (see :class:`multilock.abc.SupportsTickClaims`)."""
        names, fires = self._ticks(ticks)
        if not names:
            return {}
        won = self._claim_ticks(names, fires)
        return dict(zip(names, won, strict=True))

    def claim_tick(self, name: str, fire: TickTime) -> bool:
        """Whether this call won the tick ``(name, fire)``: ``claim_ticks`` of one."""
        won = self.claim_ticks({name: fire})
        return won[name]

    def _claim_ticks(self, names: list[str], fires: list[int]) -> list[bool]:
        """Raise each name's mark to its fire time (microseconds) where it is below, in
        one atomic step per name; whether each was raised. Backends with ``TICK_CLAIM``."""
        raise NotImplementedError

    def _try_acquire(self, name: str, ttl: float) -> LeaseBase | None:
        raise NotImplementedError

    def _try_acquire_many(self, names: list[str], ttl: float) -> dict[str, LeaseBase | None]:
        result: dict[str, LeaseBase | None] = {}
        try:
            for name in names:
                result[name] = self._try_acquire(name, ttl)
        except BaseException:
            for lease in result.values():
                if lease is not None:
                    lease.release()
            raise
        return result

    def _release_leases(self, leases: list[LeaseBase]) -> None:
        """Optional: free ``leases`` in one round trip. By default, one at a time."""
        error: Exception | None = None
        for lease in leases:
            try:
                lease._release()
            except Exception as exc:
                error = error or exc
        if error is not None:
            raise error

    def _close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class AsyncLockerBase(_LockerCommon):
    """Async locker base: implement ``async _try_acquire`` and ``async _close``."""

    # sync-by-hand: the async acquire may start at once, and is undone if cancelled
    async def try_acquire(self, name: str, *, ttl: Duration | None = None) -> AsyncLeaseBase | None:
        """A lease on ``name`` or ``None``; a cancelled acquire leaves nothing held."""
        checked, seconds = self._check(name), self._ttl(ttl)
        started = self._start_try_acquire(checked, seconds)
        work = self._try_acquire(checked, seconds) if started is None else started
        return await undo_on_cancel(work, _one_lease)

    # sync-by-hand: as try_acquire
    async def try_acquire_many(
        self, names: Iterable[str], *, ttl: Duration | None = None
    ) -> dict[str, AsyncLeaseBase | None]:
        """A lease or ``None`` per name, in order; cancellation or error leaves nothing held."""
        checked, seconds = self._names(names), self._ttl(ttl)
        started = self._start_try_acquire_many(checked, seconds)
        work = self._try_acquire_many(checked, seconds) if started is None else started
        return await undo_on_cancel(work, lambda leases: list(leases.values()))

    async def acquire(
        self, name: str, *, timeout: Duration | None = None, ttl: Duration | None = None
    ) -> AsyncLeaseBase:
        """A lease on ``name``, waiting until it is free: at most ``timeout`` (``None``:
        as long as it takes; ``0``: one try), then :class:`~multilock.errors.LockTimeout`.

        Woken by the release where the backend can tell (``watch_released``), else
        polling with jittered backoff. A wait that times out or is cancelled leaves
        nothing held and nothing queued.
        """
        checked, seconds = self._check(name), self._ttl(ttl)
        patience = Patience(checked, timeout)
        lease = None
        try:
            async with self.watch_released(checked) as watch:
                while (lease := await self.try_acquire(checked, ttl=seconds)) is None:
                    await watch.wait(patience.next_wait(watch.wakes))
        except BaseException:
            # Granted, then interrupted while the watch closed (a cancellation landing
            # in its __aexit__): nobody will have the lease, so nobody may keep the lock.
            if lease is not None:
                await lease.release()
            raise
        return lease

    def watch_released(self, name: str) -> AsyncReleaseWatch:
        """Optional: a watch woken when ``name`` is released (see :class:`AsyncReleaseWatch`
        and :class:`~multilock.abc.SupportsWatchReleased`). By default one that only
        sleeps: the waiting acquire polls."""
        return AsyncReleaseWatch()

    # async-only
    def try_acquire_many_started(
        self, names: Iterable[str], *, ttl: Duration | None = None
    ) -> Outcome[Mapping[str, AsyncLease | None]] | None:
        """:meth:`try_acquire_many` for a caller that cannot await (the scheduler, from
        its loop timer): the acquire started now, or ``None``, with nothing done, when
        the backend cannot start it at once
        (:class:`~multilock.abc.SupportsAcquireManyStarted`). Whoever drops the outcome
        unread must still release what it grants (:func:`undo_on_cancel` does)."""
        # A dict of the kit's leases is such a mapping: Future is only invariant in name
        # (said to mypy alone: cast() is a call at run time, and this is asked per tick).
        return self._start_try_acquire_many(self._names(names), self._ttl(ttl))  # type: ignore[return-value]

    # sync-by-hand: the sync form's hold is a `with` block, this one's `async with`
    def hold(
        self,
        name: str,
        *,
        at_least: Duration | None = None,
        at_most: Duration | None = None,
        since: datetime | float | None = None,
    ) -> AsyncHold:
        """``async with locker.hold(name, at_least=..., at_most=...) as lease``: ShedLock's
        lock-at-least / lock-at-most-for (see :func:`multilock.hold`)."""
        return AsyncHold(self, name, at_least=at_least, at_most=at_most, since=since)

    # sync-by-hand: the async close is shielded from the caller's cancellation
    async def aclose(self) -> None:
        """Release every lease still held and close the connection. Idempotent."""
        if not self._closed:
            self._closed = True
            await finish_shielded(self._close())

    async def claim_ticks(self, ticks: Mapping[str, TickTime]) -> dict[str, bool]:
        """Claim each ``(name, fire time)`` (backends declaring ``TICK_CLAIM``): ``True``
        for the claims won, in order -- the name's mark was below the fire time and is
        now at it (see :class:`multilock.abc.SupportsTickClaims`)."""
        names, fires = self._ticks(ticks)
        if not names:
            return {}
        won = await self._claim_ticks(names, fires)
        return dict(zip(names, won, strict=True))

    async def claim_tick(self, name: str, fire: TickTime) -> bool:
        """Whether this call won the tick ``(name, fire)``: ``claim_ticks`` of one."""
        won = await self.claim_ticks({name: fire})
        return won[name]

    async def _claim_ticks(self, names: list[str], fires: list[int]) -> list[bool]:
        """Raise each name's mark to its fire time (microseconds) where it is below, in
        one atomic step per name; whether each was raised. Backends with ``TICK_CLAIM``."""
        raise NotImplementedError

    # async-only
    def claim_ticks_started(
        self, ticks: Mapping[str, TickTime]
    ) -> Outcome[Mapping[str, bool]] | None:
        """:meth:`claim_ticks` for a caller that cannot await (the scheduler, from its
        loop timer): the claim started now, or ``None``, with nothing done, when the
        backend cannot start it at once (:class:`~multilock.abc.SupportsClaimTicksStarted`)."""
        if type(self)._start_claim_ticks is AsyncLockerBase._start_claim_ticks:
            return None  # no hook: nothing to check twice (the caller awaits claim_ticks)
        names, fires = self._ticks(ticks)
        started = self._start_claim_ticks(names, fires) if names else None
        if started is None:
            return None
        claimed: Outcome[Mapping[str, bool]] = Outcome(loop=started.get_loop())
        if started.done():  # no loop turn (nor a callback made) for an answer already there
            _settle_claims(claimed, names, started)
        else:
            started.add_done_callback(functools.partial(_settle_claims, claimed, names))
        return claimed

    # async-only
    def _start_claim_ticks(self, names: list[str], fires: list[int]) -> Outcome[list[bool]] | None:
        """Optional: send the claims now and return the :class:`Outcome` of what
        ``_claim_ticks()`` would return; ``None``: use ``_claim_ticks()`` (awaited)."""
        return None

    async def _try_acquire(self, name: str, ttl: float) -> AsyncLeaseBase | None:
        raise NotImplementedError

    # async-only
    def _start_try_acquire(self, name: str, ttl: float) -> Outcome[AsyncLeaseBase | None] | None:
        """Optional: send the acquire now and return the :class:`Outcome` of what
        ``_try_acquire()`` would return; ``None``: use ``_try_acquire()`` (in a task).

        A lease granted to a caller cancelled meanwhile is released by the base.
        """
        return None

    # async-only
    def _start_try_acquire_many(
        self, names: list[str], ttl: float
    ) -> Outcome[dict[str, AsyncLeaseBase | None]] | None:
        """Optional: :meth:`_start_try_acquire` for many names at once. By default, one
        name goes through ``_start_try_acquire`` (the scheduler asks for the one job
        due, most often); ``None``: use ``_try_acquire_many()`` (in a task)."""
        if len(names) != 1:
            return None
        (name,) = names
        one = self._start_try_acquire(name, ttl)
        if one is None:
            return None
        many: Outcome[dict[str, AsyncLeaseBase | None]] = Outcome(loop=one.get_loop())

        def settle(done: asyncio.Future[AsyncLeaseBase | None]) -> None:
            error = done.exception()
            if error is not None:
                many.set_exception(error)
            else:
                many.set_result({name: done.result()})

        if one.done():
            settle(one)  # no loop turn for an answer already there
        else:
            one.add_done_callback(settle)
        return many

    async def _try_acquire_many(
        self, names: list[str], ttl: float
    ) -> dict[str, AsyncLeaseBase | None]:
        result: dict[str, AsyncLeaseBase | None] = {}
        try:
            for name in names:
                result[name] = await self._try_acquire(name, ttl)
        except BaseException:
            for lease in result.values():
                if lease is not None:
                    await lease.release()
            raise
        return result

    # sync-by-hand: shielded from the caller's cancellation
    async def release_many(self, leases: Sequence[AsyncLeaseBase]) -> None:
        """Release ``leases`` (all of this locker) as ``release()`` each would, in one
        round trip where the backend overrides ``_release_leases``: for the scheduler,
        whose lease holds end together (:class:`~multilock.abc.SupportsAsyncReleaseMany`).
        Finishes even if the caller is cancelled; the first error is raised after the
        rest."""
        pending = [lease for lease in leases if not lease._released]
        for lease in pending:
            lease._released = True
        await finish_shielded(self._release_leases(pending))

    async def _release_leases(self, leases: list[AsyncLeaseBase]) -> None:
        """Optional: free ``leases`` in one round trip. By default, one at a time."""
        error: Exception | None = None
        for lease in leases:
            try:
                await lease._release()
            except Exception as exc:
                error = error or exc
        if error is not None:
            raise error

    async def _close(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


def _one_lease(lease: AsyncLeaseBase | None) -> list[AsyncLeaseBase | None]:
    return [lease]
