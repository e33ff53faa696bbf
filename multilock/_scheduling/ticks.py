"""Ticks for schedulers that are not ours: which tick a call is for, and when it is late.

A cron daemon, APScheduler or Celery beat on each replica fires "the same" tick at
slightly different instants (clocks disagree, processes start late). The winner keeps
the lock until ``tick + hold``; a replica runs the tick only if it holds the lock by
``tick + hold - 2 x skew_tolerance`` by its own clock, so that a replica whose clock
is behind still finds the winner's lease there -- the scheduler's rule (its hold is
``2 x skew_tolerance + misfire_grace``) read the other way round.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Literal

from .._durations import Duration, parse_duration
from ..errors import ConfigurationError

__all__ = ["TICK_UNITS", "TickUnit", "check_hold", "latest_start", "parse_tick", "tick_of"]

TickUnit = Literal["second", "minute"]
TICK_UNITS: dict[str, float] = {"second": 1.0, "minute": 60.0}


def tick_of(moment: float, unit: TickUnit | float) -> float:
    """The tick a call made at ``moment`` (epoch seconds) is for: ``moment`` rounded down
    to its minute or second (or to a multiple of ``unit`` seconds since the epoch)."""
    every = TICK_UNITS[unit] if isinstance(unit, str) else unit
    return math.floor(moment / every) * every


def parse_tick(text: str) -> float:
    """An ISO 8601 time (``2026-01-01T03:00``; UTC unless it has an offset) as epoch
    seconds, or :class:`ConfigurationError` naming it."""
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ConfigurationError(
            f"invalid tick {text!r}: expected 'minute', 'second' or an ISO time such as"
            " 2026-01-01T03:00 (UTC unless it has an offset)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def check_hold(
    hold: Duration, skew_tolerance: Duration, interval: float | None = None
) -> tuple[float, float]:
    """``(hold, skew_tolerance)`` in seconds, the hold longer than twice the tolerance
    (else no replica could ever be on time) and, where the ``interval`` between ticks is
    known, at most ``interval - 2 x skew_tolerance`` (else the next tick's earliest
    replica would find this tick's lock still held by the latest one, and skip it)."""
    held = parse_duration(hold, what="hold")
    skew = parse_duration(skew_tolerance, what="skew_tolerance")
    if held <= 2 * skew:
        raise ConfigurationError(
            f"hold ({held:g} s) must be longer than twice the skew tolerance ({skew:g} s):"
            " a replica must hold the lock by tick + hold - 2 x skew tolerance to run the tick"
        )
    if interval is not None and held + 2 * skew > interval:
        raise ConfigurationError(
            f"hold ({held:g} s) + 2 x skew tolerance ({skew:g} s) must not exceed the"
            f" interval between ticks ({interval:g} s): the next tick's earliest replica"
            " would find the lock still held"
        )
    return held, skew


def latest_start(tick: float, hold: float, skew_tolerance: float) -> float:
    """The last instant (by this replica's clock) at which it may still run ``tick``:
    a replica whose clock is behind by up to ``skew_tolerance`` still finds the lease
    of a winner whose clock is ahead by as much, which keeps it until ``tick + hold``."""
    return tick + hold - 2 * skew_tolerance
