"""Keeping leases: renewal where the backend does not renew, and leader election.

:class:`Campaign` is the election itself (the scheduler's leader mode runs one);
:func:`leadership` gives it to applications as a context manager, ``async with``
(:class:`AsyncLeadership`) or ``with`` (:class:`Leadership`, the campaign on a thread
of its own).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import math
import os
import random
import socket
import threading
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Self, overload

from .._durations import Duration, parse_duration
from .._locks.base import AsyncReleaseWatch, check_name
from .._locks.holds import is_async_locker
from .._locks.outcome import finish_shielded
from .._locks.sync_adapter import AsyncView
from .._masking import masked_line
from .._signal import LostSignal
from ..abc import (
    AsyncDistributedLock,
    AsyncLease,
    AsyncWatch,
    Capability,
    DistributedLock,
    SupportsWatchReleased,
)
from ..errors import BackendUnavailable, ConfigurationError, LockLost
from .clock import Clock, SystemClock
from .repeats import Repeats
from .runs import wait_quietly

__all__ = [
    "AsyncLeadership",
    "Campaign",
    "Leadership",
    "keep_alive",
    "leadership",
    "needs_keep_alive",
]

log = logging.getLogger("multilock.scheduler")
_public_log = logging.getLogger("multilock.leadership")


def keep_alive(
    locker: AsyncDistributedLock,
    lease: AsyncLease,
    ttl: float,
    clock: Clock,
    unanswered: Callable[[str, str], bool] = lambda problem, what: True,
    refused: Callable[[str], object] = lambda reason: None,
) -> asyncio.Task[None] | None:
    """Extend ``lease`` every ``ttl / 3`` while held, if the backend has TTL leases it
    does not renew itself; ``None`` (nothing to do) otherwise. Cancel the task to stop.
    An unreachable backend is reported to ``unanswered`` (logged only if it says it is
    news); an extend refused (``LockLost``: expired, or held by another owner) is
    told to ``refused`` with why."""
    if not needs_keep_alive(locker):
        return None
    return asyncio.ensure_future(_extend_periodically(lease, ttl, clock, unanswered, refused))


def needs_keep_alive(locker: AsyncDistributedLock) -> bool:
    """Whether ``locker``'s leases expire unless extended: TTL leases the backend does
    not renew itself (session-bound leases and self-renewing backends need nothing)."""
    caps: frozenset[Capability] = getattr(locker, "capabilities", frozenset())
    return Capability.TTL in caps and Capability.RENEWAL not in caps


async def _extend_periodically(
    lease: AsyncLease,
    ttl: float,
    clock: Clock,
    unanswered: Callable[[str, str], bool],
    refused: Callable[[str], object],
) -> None:
    period = ttl / 3
    while True:
        # At the next multiple of ttl/3 on the clock, not ttl/3 after this task began: a
        # lease handed from run to run (the next tick taking over the hold), each run
        # with a renewal of its own, is still extended every ttl/3 however often the
        # runs change (restarting the wait at each one, it expired).
        now = clock.now()
        deadline = (math.floor(now / period) + 1) * period
        while deadline <= now:  # float rounding, near a multiple
            deadline += period
        await clock.sleep_until(deadline)
        if not lease.held:  # released (maybe still in flight) or lost meanwhile
            return
        try:
            # Finished even if this renewal is cancelled meanwhile (the next tick took the
            # lease over and starts its own): a dropped extension, tick after tick, let it
            # expire.
            await finish_shielded(lease.extend(ttl))
        except BackendUnavailable as exc:  # its lost signal tells the holder
            if unanswered(masked_line(exc), "extends failed"):
                log.warning("extending the lease on %s failed: %s", lease.name, masked_line(exc))
            return
        except LockLost as exc:  # lost: its holder reports that, once
            log.debug("extending the lease on %s failed: %s", lease.name, masked_line(exc))
            refused(f"extending the lease was refused: {masked_line(exc)}")
            return
        except Exception:
            log.warning("extending the lease on %s failed", lease.name, exc_info=True)
            return


class Campaign:
    """Competes for the lease on ``name`` until cancelled, and leads while it holds it:
    the one implementation of leader election, under the scheduler's leader mode and
    :func:`multilock.leadership`.

    A term begins when ``try_acquire`` grants the lease (tried at once, then every
    ``poll`` plus up to ``jitter``): ``elected`` fires, ``on_elected`` is called (one
    that returns an awaitable has it run as a task for the term). It ends when the
    lease is lost (its ``lost`` signal, or found released underneath: a closed locker)
    or at :meth:`release`: ``revoked`` fires at once, the term's task is cancelled and
    awaited, ``on_revoked`` is called (awaited if it returns an awaitable), then (at
    :meth:`release`) the lease is released -- in that order, so that the work has
    stopped before another replica can be elected. A lost lease is left to the
    backend: "lost" may mean "not confirmed", and the scheduler's runs under it may
    still be stopping. After a lost term the campaign backs off one poll, then
    competes again.
    """

    def __init__(
        self,
        locker: AsyncDistributedLock,
        name: str,
        *,
        ttl: float,
        poll: float,
        clock: Clock,
        replica_id: str,
        jitter: float = 0.0,
        on_elected: Callable[[], object] | None = None,
        on_revoked: Callable[[], object] | None = None,
        answered: Callable[[], object] = lambda: None,
        unanswered: Callable[[str, str], bool] = lambda problem, what: True,
        logger: logging.Logger = log,
        woken: bool = False,
    ) -> None:
        # Whether a follower's wait ends early when the backend announces a release
        # (the waiting acquire's watch, where the locker has one); real time only.
        self._woken = woken
        self.locker = locker
        self._answered = answered  # the backend answered
        self._unanswered = unanswered  # it did not: True if that is news to log
        self.name = name
        self.ttl = ttl
        self.poll = poll
        self.jitter = jitter
        self.clock = clock
        self.replica_id = replica_id
        self.on_elected = on_elected
        self.on_revoked = on_revoked
        self._log = logger
        self.lease: AsyncLease | None = None
        self.since = 0.0
        """When (by the clock) this replica last became leader."""
        self.elected = LostSignal()
        """Fires when this replica becomes leader (a fresh one after each term)."""
        self.revoked = LostSignal()
        """Fires (with why) when the term ends; already fired while not leading."""
        self.revoked.set("not elected yet")
        self._term: asyncio.Task[object] | None = None  # on_elected's awaitable, if any
        self._failing = Repeats(logger, clock)

    @property
    def locker(self) -> AsyncDistributedLock:
        """The locker the campaign competes on (replaceable while not running)."""
        return self._locker

    @locker.setter
    def locker(self, locker: AsyncDistributedLock) -> None:
        self._locker = locker
        # Looked up once per locker, not at every term.
        self._watch_released = (
            locker.watch_released
            if self._woken and isinstance(locker, SupportsWatchReleased)
            else None
        )

    @property
    def held(self) -> bool:
        """Whether this replica leads now: the term's lease held, the term not revoked
        (an extend refused revokes it before its task has ended it)."""
        return self.lease is not None and self.lease.held and not self.revoked.is_set()

    async def run(self) -> None:
        """Compete for the lead until cancelled: try every ``poll``, hold while it lasts.

        Cancelled while leading, the term goes on (renewal stopped): :meth:`release`
        ends it."""
        while True:
            await self._lead(await self._follow())
            await self._pause()  # after a lost term: a flapping leader yields

    async def _follow(self) -> AsyncLease:
        """Try every poll until granted; between tries, woken by an announced release
        where the campaign and the backend can."""
        watch = await self._watch()
        try:
            while (lease := await self._try_acquire()) is None:
                await self._pause(watch)
            return lease
        finally:
            if watch is not None:
                await finish_shielded(_leave_watch(watch, self._log))

    async def _watch(self) -> AsyncWatch | None:
        """The locker's release watch, entered (before the first try: no release is
        missed between a refusal and the wait), or ``None``: sleep between tries."""
        make = self._watch_released
        if make is None:
            return None
        try:
            watch = make(self.name)
            await watch.__aenter__()
        except Exception as exc:  # the polls still come: a wake-up is only a hint
            self._log.debug("leader election: no release watch: %s", masked_line(exc))
            return None
        # The kit's own watch only sleeps: the clock's sleep instead. A backend's may
        # start listening only at its first wait (Redis subscribes then): kept.
        if type(watch) is AsyncReleaseWatch:
            await _leave_watch(watch, self._log)
            return None
        return watch

    async def _pause(self, watch: AsyncWatch | None = None) -> None:
        wait = self.poll + (random.uniform(0, self.jitter) if self.jitter else 0.0)
        if watch is not None:
            try:
                await watch.wait(wait)
                return
            except Exception as exc:
                self._log.debug("leader election: the release watch failed: %s", exc)
        await self.clock.sleep_until(self.clock.now() + wait)

    async def release(self, reason: str = "released") -> None:
        """Step down (at shutdown): end the term, if any, and release the lease."""
        await finish_shielded(self._end(reason, release=True))

    async def _try_acquire(self) -> AsyncLease | None:
        try:
            lease = await self.locker.try_acquire(self.name, ttl=self.ttl)
        except BackendUnavailable as exc:  # one outage, reported once with the others'
            problem = masked_line(exc)
            if self._unanswered(problem, "leader polls failed"):
                self._log.warning("leader election: the lock could not be asked: %s", problem)
            return None
        except Exception as exc:  # not an outage (a closed locker, a bug): once, then counted
            if self._failing.report(f"{type(exc).__name__}: {masked_line(exc)}", "polls failed"):
                self._log.warning("leader election: the lock could not be asked", exc_info=True)
            return None
        self._answered()
        self._failing.clear("leader polls answered again")
        return lease

    async def _lead(self, lease: AsyncLease) -> None:
        self._begin(lease)
        # A backend without a lost signal tells of a loss only by refusing an extend.
        refused = LostSignal()
        refused.add_callback(self.revoked.set)
        renewal = keep_alive(self.locker, lease, self.ttl, self.clock, refused=refused.set)
        try:
            reason = await self._until_over(lease, refused)
        finally:
            if renewal is not None:
                renewal.cancel()
        self._log.warning(
            "leadership of %s lost: %s", self.name, reason, extra={"replica_id": self.replica_id}
        )
        await finish_shielded(self._end(reason, release=False))

    def _begin(self, lease: AsyncLease) -> None:
        self.lease, self.since = lease, self.clock.now()
        revoked = self.revoked = LostSignal()
        # Fired by the backend's own notice, from whatever thread: waiters wake even
        # before this task runs again.
        lease.lost.add_callback(revoked.set)
        self._log.info("this replica leads %s", self.name, extra={"replica_id": self.replica_id})
        if self.on_elected is not None:
            started = _call(self.on_elected, "on_elected", self._log)
            if started is not None:
                self._term = asyncio.ensure_future(started)
                self._term.add_done_callback(self._term_over)
        self.elected.set("elected")

    def _term_over(self, task: asyncio.Task[object]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self._log.error("on_elected failed", exc_info=task.exception())

    async def _until_over(self, lease: AsyncLease, refused: LostSignal) -> str:
        """Why the term is over: the lease's loss, an extend refused, or ``lease.held``
        found false (a release the lost signal does not tell of: its locker closed),
        checked every poll."""
        lost = asyncio.ensure_future(_reason(lease.lost))
        gone = asyncio.ensure_future(_reason(refused))
        try:
            while True:
                pause = asyncio.ensure_future(self.clock.sleep_until(self.clock.now() + self.poll))
                try:
                    await asyncio.wait({lost, gone, pause}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    pause.cancel()
                for ended in (lost, gone):
                    if ended.done():
                        return ended.result()
                if not lease.held:
                    return "the lease was released underneath (its locker closed?)"
        finally:
            lost.cancel()
            gone.cancel()

    async def _end(self, reason: str, *, release: bool) -> None:
        lease, self.lease = self.lease, None
        if lease is None:
            return
        self.revoked.set(reason)
        self.elected = LostSignal()
        term, self._term = self._term, None
        if term is not None:
            term.cancel()
            await wait_quietly(term)
        if self.on_revoked is not None:
            stopping = _call(self.on_revoked, "on_revoked", self._log)
            if stopping is not None:
                try:
                    await stopping
                except Exception:
                    self._log.exception("on_revoked failed")
        if not release:
            return
        try:
            await lease.release()
        except Exception as exc:
            self._log.warning("releasing the leader lease failed: %s", masked_line(exc))


def _call(
    callback: Callable[[], object], what: str, logger: logging.Logger
) -> Awaitable[object] | None:
    """Call ``callback()``: what it returned if that is awaitable, else ``None``; an
    error is logged, never raised."""
    try:
        result = callback()
    except Exception:
        logger.exception("%s failed", what)
        return None
    return result if inspect.isawaitable(result) else None


async def _reason(signal: LostSignal) -> str:
    return await signal


async def _leave_watch(watch: AsyncWatch, logger: logging.Logger) -> None:
    try:
        await watch.__aexit__(None, None, None)
    except Exception as exc:  # it must leave nothing behind: said if it could not
        logger.warning("leader election: leaving the release watch failed: %s", exc)


# --- the public API ---------------------------------------------------------------------


class AsyncLeadership:
    """``async with multilock.leadership(locker, name) as lead`` (see :func:`leadership`)."""

    def __init__(
        self,
        locker: AsyncDistributedLock,
        name: str,
        *,
        ttl: Duration = 10.0,
        poll: Duration = 1.0,
        jitter: Duration = 0.1,
        on_elected: Callable[[], object] | None = None,
        on_revoked: Callable[[], object] | None = None,
        clock: Clock | None = None,
    ) -> None:
        # Every problem now: a bad name would otherwise be a warning every poll.
        check_name(name)
        clock = clock or SystemClock()
        outage = Repeats(_public_log, clock)
        self._campaign = Campaign(
            locker,
            name,
            ttl=parse_duration(ttl, what="ttl"),
            poll=_positive(poll, "poll"),
            jitter=0.0 if jitter == 0 else parse_duration(jitter, what="jitter"),
            clock=clock,
            replica_id=f"{socket.gethostname()}-{os.getpid()}",
            on_elected=on_elected,
            on_revoked=on_revoked,
            answered=lambda: outage.clear("backend reachable again"),
            unanswered=outage.report,
            logger=_public_log,
            woken=isinstance(clock, SystemClock),  # a test's clock is slept on, never woken
        )
        self._task: asyncio.Task[None] | None = None

    @property
    def name(self) -> str:
        """The lock name the replicas compete for."""
        return self._campaign.name

    @property
    def is_leader(self) -> bool:
        """Whether this replica leads now: its lease is held (false as soon as the
        backend tells of a loss, before ``on_revoked`` has run)."""
        return self._campaign.held

    @property
    def elected(self) -> LostSignal:
        """Fires when this replica becomes leader; already fired while it leads.
        ``await lead.elected`` waits for the lead (``asyncio.timeout`` bounds it),
        ``lead.elected.wait(seconds)`` from a thread."""
        return self._campaign.elected

    @property
    def revoked(self) -> LostSignal:
        """Fires when the current term ends, with why (lost, released); already fired
        while not leading. ``await lead.revoked`` returns the reason."""
        return self._campaign.revoked

    @property
    def lease(self) -> AsyncLease | None:
        """The leader lease while leading (its ``fencing_token`` fences the leader's
        writes where the backend has ``FENCING``), else ``None``."""
        lease = self._campaign.lease
        return lease if lease is not None and lease.held else None

    async def __aenter__(self) -> Self:
        if self._task is not None:
            raise RuntimeError(f"the leadership of {self.name!r} is already entered")
        self._task = asyncio.create_task(
            self._campaign.run(), name=f"multilock-leadership-{self.name}"
        )
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        # The lease goes even if the block is being cancelled: the next leader need not
        # wait for its ttl.
        await finish_shielded(self._stop())

    async def _stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        try:
            await asyncio.wait({task})
            failed = None if task.cancelled() else task.exception()
            if failed is not None:  # a bug of the campaign: said, not swallowed
                raise failed
        finally:
            await self._campaign.release("the leadership block ended")


class Leadership:
    """``with multilock.leadership(sync_locker, name) as lead`` (see :func:`leadership`):
    the campaign runs on a thread of its own, with its own event loop; the callbacks
    are called on that thread."""

    def __init__(
        self,
        locker: DistributedLock,
        name: str,
        *,
        ttl: Duration = 10.0,
        poll: Duration = 1.0,
        jitter: Duration = 0.1,
        on_elected: Callable[[], object] | None = None,
        on_revoked: Callable[[], object] | None = None,
        clock: Clock | None = None,
    ) -> None:
        self._locker = locker
        self._view = AsyncView(locker)
        self._lead = AsyncLeadership(
            self._view,
            name,
            ttl=ttl,
            poll=poll,
            jitter=jitter,
            on_elected=on_elected,
            on_revoked=on_revoked,
            clock=clock,
        )
        self._thread: threading.Thread | None = None
        self._stop: Callable[[], object] | None = None
        self._failed: BaseException | None = None

    @property
    def name(self) -> str:
        """The lock name the replicas compete for."""
        return self._lead.name

    @property
    def is_leader(self) -> bool:
        """Whether this replica leads now (see :attr:`AsyncLeadership.is_leader`)."""
        return self._lead.is_leader

    @property
    def elected(self) -> LostSignal:
        """Fires when this replica becomes leader: ``lead.elected.wait(seconds)``."""
        return self._lead.elected

    @property
    def revoked(self) -> LostSignal:
        """Fires when the current term ends: ``lead.revoked.wait(seconds)``; its
        ``reason`` says why."""
        return self._lead.revoked

    @property
    def lease(self) -> AsyncLease | None:
        """The leader lease while leading, seen through the async contract (its
        ``fencing_token``, ``expires_at``...), else ``None``."""
        return self._lead.lease

    def __enter__(self) -> Self:
        if self._thread is not None:
            raise RuntimeError(f"the leadership of {self.name!r} is already entered")
        started = threading.Event()
        self._thread = threading.Thread(
            target=asyncio.run,
            args=(self._serve(started),),
            name=f"multilock-leadership-{self.name}",
            daemon=True,
        )
        self._thread.start()
        started.wait()
        if self._failed is not None:
            self._thread.join()
            self._thread = None
            raise self._failed
        return self

    async def _serve(self, started: threading.Event) -> None:
        loop, done = asyncio.get_running_loop(), asyncio.Event()

        def stop() -> None:
            with contextlib.suppress(RuntimeError):  # the loop is over already (it failed)
                loop.call_soon_threadsafe(done.set)

        self._stop = stop
        try:
            async with self._lead:
                started.set()
                await done.wait()
        except BaseException as exc:
            self._failed = exc
        finally:
            await self._view.aclose()
            started.set()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        thread, stop = self._thread, self._stop
        if thread is None or stop is None:
            return
        stop()
        thread.join()
        self._thread = self._stop = None
        # Entered again, it needs a worker thread again.
        self._view = AsyncView(self._locker)
        self._lead._campaign.locker = self._view
        failed, self._failed = self._failed, None
        if failed is not None:
            raise failed


@overload
def leadership(
    locker: AsyncDistributedLock,
    name: str,
    *,
    ttl: Duration = ...,
    poll: Duration = ...,
    jitter: Duration = ...,
    on_elected: Callable[[], object] | None = ...,
    on_revoked: Callable[[], object] | None = ...,
    clock: Clock | None = ...,
) -> AsyncLeadership: ...


@overload
def leadership(
    locker: DistributedLock,
    name: str,
    *,
    ttl: Duration = ...,
    poll: Duration = ...,
    jitter: Duration = ...,
    on_elected: Callable[[], object] | None = ...,
    on_revoked: Callable[[], object] | None = ...,
    clock: Clock | None = ...,
) -> Leadership: ...


def leadership(
    locker: AsyncDistributedLock | DistributedLock,
    name: str,
    *,
    ttl: Duration = 10.0,
    poll: Duration = 1.0,
    jitter: Duration = 0.1,
    on_elected: Callable[[], object] | None = None,
    on_revoked: Callable[[], object] | None = None,
    clock: Clock | None = None,
) -> AsyncLeadership | Leadership:
    """Campaign for the lead on ``name`` among the replicas, for as long as the block runs.

    ``async with leadership(locker, name) as lead`` on an async locker, ``with`` on a
    sync one. Entering does not wait: the campaign runs in the background (a task, or
    a thread for a sync locker) and ``await lead.elected`` (``lead.elected.wait(t)``)
    waits for the lead -- kazoo's ``election.run`` is ``await lead.elected`` then the
    work. ``lead.is_leader`` says whether this replica leads now; ``lead.revoked``
    fires when the term ends. A leader whose lease is lost (its ``lost`` signal, or
    found released) is revoked at once, and competes again after ``poll``; leaving the
    block ends the term and releases the lease, so that another replica is elected
    without waiting for the ttl: at once where the backend announces releases (those
    waiting acquires are woken by: memory://, Redis, ZooKeeper; async lockers only),
    else at its next poll.

    The lease is tried at once, then every ``poll`` plus a random part of ``jitter``
    (replicas started together spread their polls; ``0`` for none); ``ttl`` is its
    ttl on TTL backends -- how long a crashed leader keeps the lead -- and renewed
    every ``ttl / 3`` where the backend does not renew it. ``on_elected()`` is called
    when a term begins: one that returns an awaitable (an ``async def``) has it run as
    a task for the term, cancelled when the term ends. ``on_revoked()`` is called when
    it ends, after that task is over and before the lease is released (awaited if it
    returns an awaitable), so that the work has stopped before another replica can
    lead. They
    run on the campaign's event loop (for a sync locker, its thread): a sync callback
    must return quickly. An error of a callback is logged, not raised. The ``lease``
    (while leading) carries the fencing token.
    """
    options: dict[str, Any] = {
        "ttl": ttl,
        "poll": poll,
        "jitter": jitter,
        "on_elected": on_elected,
        "on_revoked": on_revoked,
        "clock": clock,
    }
    if is_async_locker(locker):
        return AsyncLeadership(locker, name, **options)  # type: ignore[arg-type]
    return Leadership(locker, name, **options)  # type: ignore[arg-type]


def _positive(value: Duration, what: str) -> float:
    seconds = parse_duration(value, what=what)
    if seconds <= 0:
        raise ConfigurationError(f"{what} must be positive")
    return seconds
