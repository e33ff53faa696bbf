"""``@multilock.once_per_tick(locker, name, hold=...)``: one run per tick across replicas,
for a function that any scheduler calls on every replica."""

from __future__ import annotations

import functools
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, ParamSpec, TypeVar, overload

from .._durations import Duration
from .._locks.holds import hold as hold_lock
from .._locks.holds import is_async_locker
from ..abc import AsyncDistributedLock, DistributedLock
from ..errors import ConfigurationError
from .ticks import TICK_UNITS, TickUnit, check_hold, latest_start, tick_of

__all__ = ["may_run", "once_per_tick", "shown_tick", "too_late"]

log = logging.getLogger("multilock.once")

P = ParamSpec("P")
R = TypeVar("R")
TickSource = TickUnit | Callable[[], datetime | float]


def _ticker(tick: TickSource) -> Callable[[], float]:
    if callable(tick):
        source = tick

        def given() -> float:
            moment = source()
            if isinstance(moment, datetime):
                if moment.tzinfo is None:
                    raise ConfigurationError(
                        f"the tick {moment.isoformat()} has no timezone: return an aware time"
                    )
                return moment.timestamp()
            return float(moment)

        return given
    if tick not in TICK_UNITS:
        raise ConfigurationError(
            f"invalid tick {tick!r}: expected 'second', 'minute' or a function returning the"
            " fire time"
        )
    unit: TickUnit = tick
    return lambda: tick_of(time.time(), unit)


def too_late(tick: float, hold: float, skew: float) -> str | None:
    """Why the tick ``tick`` may no longer run here (this clock is past its latest
    start), or ``None`` when it may."""
    now, latest = time.time(), latest_start(tick, hold, skew)
    if now <= latest:
        return None
    return (
        f"{now - tick:.3f} s after the tick, later than hold - 2 x skew tolerance"
        f" ({latest - tick:.3f} s): another replica may have run it and released"
    )


@overload
def once_per_tick(
    locker: AsyncDistributedLock,
    name: str,
    *,
    hold: Duration,
    skew_tolerance: Duration = ...,
    tick: TickSource = ...,
    at_most: Duration | None = ...,
) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R | None]]]: ...


@overload
def once_per_tick(
    locker: DistributedLock,
    name: str,
    *,
    hold: Duration,
    skew_tolerance: Duration = ...,
    tick: TickSource = ...,
    at_most: Duration | None = ...,
) -> Callable[[Callable[P, R]], Callable[P, R | None]]: ...


def once_per_tick(
    locker: DistributedLock | AsyncDistributedLock,
    name: str,
    *,
    hold: Duration,
    skew_tolerance: Duration = 0.25,
    tick: TickSource = "second",
    at_most: Duration | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a function that a scheduler calls on every replica so that each tick runs
    on one replica only; the others return ``None`` without calling it.

    The tick is the call's second (``tick="second"``, the default), its minute
    (``"minute"``), or what ``tick()`` returns (an aware datetime or epoch seconds: the
    scheduled fire time where the scheduler tells it). The winner keeps the lock until
    ``hold`` has passed since the tick (then releases it in the background), so that a
    replica firing the same tick later skips it; a replica that holds the lock only
    after ``tick + hold - 2 x skew_tolerance`` by its own clock skips too (too late to be
    sure). ``hold`` must be longer than twice ``skew_tolerance``, and ``hold + 2 x
    skew_tolerance`` at most the interval between ticks (else the next tick's earliest
    replica finds the lock still held). ``at_most`` is the lease's ttl (ShedLock's
    lock-at-most-for). A sync function needs a sync locker (``multilock.connect``), a
    coroutine function an async one (``multilock.connect_async``).
    """
    held, skew = check_hold(hold, skew_tolerance)
    fire_time = _ticker(tick)

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        hold_for = functools.partial(_hold_for, locker, name, held, at_most)
        is_async = inspect.iscoroutinefunction(func)
        if is_async != is_async_locker(locker):
            want = "an async locker (multilock.connect_async)" if is_async else "a sync locker"
            kind = "coroutine function" if is_async else "function"
            raise ConfigurationError(
                f"once_per_tick on the {kind} {func.__qualname__} needs {want}"
            )
        if is_async:

            @functools.wraps(func)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                at = fire_time()
                async with hold_for(at) as lease:
                    if not may_run(name, lease is not None, at, held, skew):
                        return None
                    return await func(*args, **kwargs)

            return run_async

        @functools.wraps(func)
        def run(*args: Any, **kwargs: Any) -> Any:
            at = fire_time()
            with hold_for(at) as lease:
                if not may_run(name, lease is not None, at, held, skew):
                    return None
                return func(*args, **kwargs)

        return run

    return decorate


def _hold_for(locker: Any, name: str, hold: float, at_most: Duration | None, tick: float) -> Any:
    """The hold of ``tick`` on ``locker`` (a :class:`Hold` or :class:`AsyncHold`)."""
    return hold_lock(locker, name, at_least=hold, at_most=at_most, since=tick)


def may_run(name: str, held: bool, tick: float, hold: float, skew: float) -> bool:
    """Whether this replica runs ``tick``: it holds the lock, in time. Another replica
    having it is the normal case (DEBUG); too late is worth a WARNING."""
    if not held:
        log.debug("%s: tick %s is held by another replica: skipped", name, shown_tick(tick))
        return False
    late = too_late(tick, hold, skew)
    if late is not None:
        log.warning("%s: tick %s skipped, %s", name, shown_tick(tick), late)
    return late is None


def shown_tick(tick: float) -> str:
    """``tick`` (epoch seconds) as an ISO time in UTC, for messages."""
    return datetime.fromtimestamp(tick, UTC).isoformat()
