"""Clocks: every time decision of the scheduler goes through one, so tests can drive it."""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import itertools
import time
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

__all__ = ["Cancellable", "Clock", "ManualClock", "SharedTimers", "SystemClock", "call_at"]

K = TypeVar("K")


class Clock(Protocol):
    """Wall time as the scheduler sees it, in seconds since the epoch (UTC)."""

    def now(self) -> float:
        """The current time, seconds since the epoch."""

    async def sleep_until(self, deadline: float) -> None:
        """Return once :meth:`now` has reached ``deadline`` (at once if it has)."""


class SystemClock:
    """The host clock, optionally shifted by ``offset`` seconds (to simulate skew)."""

    def __init__(self, offset: float = 0.0) -> None:
        self.offset = offset

    def now(self) -> float:
        """``time.time() + offset``."""
        return time.time() + self.offset

    async def sleep_until(self, deadline: float) -> None:
        """Sleep until the (shifted) host clock reaches ``deadline``."""
        # Re-check after waking: the event loop's timer may fire a little early.
        left = deadline - self.now()
        while left > 0:
            await asyncio.sleep(left)
            left = deadline - self.now()

    def __repr__(self) -> str:
        return f"SystemClock(offset={self.offset!r})"


class Cancellable(Protocol):
    """A timer armed by :func:`call_at`."""

    def cancel(self) -> object:
        """Do not call it (if not called yet)."""


def call_at(
    clock: Clock,
    deadline: float,
    callback: Callable[[], object],
    context: contextvars.Context | None = None,
) -> Cancellable:
    """Call ``callback()`` on the running loop once ``clock`` reads ``deadline`` (in
    ``context``, else a copy of the current one); returns the timer, to cancel it.

    On a :class:`SystemClock` this is a plain loop timer: the scheduler arms one per
    run for the lease hold, and a task sleeping per run costs several times as much.
    Other clocks (a :class:`ManualClock` in tests) get a task awaiting ``sleep_until``.
    The timer itself is returned, not a function cancelling it: the scheduler arms one
    at every wake, and each object made there is one more for the garbage collector.
    """
    if isinstance(clock, SystemClock):
        loop = asyncio.get_running_loop()
        return loop.call_later(max(0.0, deadline - clock.now()), callback, context=context)
    waiting = asyncio.ensure_future(clock.sleep_until(deadline))
    waiting.add_done_callback(
        lambda done: None if done.cancelled() else callback(), context=context
    )
    return waiting


class SharedTimers(Generic[K]):
    """Keys due at the same clock time share one timer, which calls ``callback(key)`` for each.

    The lease holds of all the jobs of a tick end at the same instant: one loop
    timer for them all instead of a thousand in the loop's heap. A key is its own
    handle (no closure or bound method is made per key): with a thousand runs
    holding leases, each such object is one more for the garbage collector to
    trace, again and again, through the hold.
    """

    def __init__(self, clock: Clock, callback: Callable[[K], object]) -> None:
        self._clock = clock
        self._callback = callback
        self._due: dict[float, dict[K, None]] = {}

    def add(self, deadline: float, key: K) -> None:
        """Call ``callback(key)`` once the clock reads ``deadline``, unless :meth:`discard`-ed."""
        group = self._due.get(deadline)
        if group is None:
            group = self._due[deadline] = {}
            call_at(self._clock, deadline, lambda: self._fire(deadline))
        group[key] = None

    def discard(self, deadline: float, key: K) -> None:
        """Forget ``key`` (added for ``deadline``), if still due."""
        group = self._due.get(deadline)
        if group is not None:
            group.pop(key, None)

    def _fire(self, deadline: float) -> None:
        # The group stays in place while it fires: a callback may discard a key not
        # called yet, or add one for this same deadline (it is called too).
        group, callback = self._due.get(deadline), self._callback
        while group:
            for key in list(group):
                if key in group:
                    del group[key]
                    callback(key)
        self._due.pop(deadline, None)


class ManualClock:
    """A clock that only moves when told to: :meth:`advance` or :meth:`set`.

    Sleepers whose deadline is reached are woken in deadline order. Must be
    used from one event loop. :meth:`shifted` gives views of the same clock
    ahead of or behind it, as replicas with skewed clocks would see it.
    """

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self._now = float(start)
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def now(self) -> float:
        """The current manual time."""
        return self._now

    async def sleep_until(self, deadline: float) -> None:
        """Wait until the clock is moved to ``deadline`` or beyond."""
        if deadline <= self._now:
            await asyncio.sleep(0)  # still a scheduling point, like a real sleep
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (deadline, next(self._order), future))
        await future

    def set(self, when: float) -> None:
        """Move the clock to ``when`` (never backwards) and wake the due sleepers."""
        if when < self._now:
            raise ValueError(f"a ManualClock never goes backwards ({when} < {self._now})")
        self._now = float(when)
        while self._sleepers and self._sleepers[0][0] <= self._now:
            _, _, future = heapq.heappop(self._sleepers)
            if not future.done():
                future.set_result(None)

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds``."""
        self.set(self._now + seconds)

    def shifted(self, offset: float) -> ShiftedClock:
        """A view of this clock that reads ``offset`` seconds ahead (or behind, if < 0)."""
        return ShiftedClock(self, offset)


class ShiftedClock:
    """A :class:`ManualClock` seen with a constant offset (a replica with a skewed clock)."""

    def __init__(self, base: ManualClock, offset: float) -> None:
        self.base = base
        self.offset = offset

    def now(self) -> float:
        """The base clock plus the offset."""
        return self.base.now() + self.offset

    async def sleep_until(self, deadline: float) -> None:
        """Wait until the base clock reaches ``deadline - offset``."""
        await self.base.sleep_until(deadline - self.offset)
