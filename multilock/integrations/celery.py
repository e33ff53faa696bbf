"""Celery beat: each tick of a schedule entry is sent by one of the beat replicas.

Run a ``celery beat`` on every replica with this scheduler::

    celery -A proj beat -S multilock.integrations.celery:Scheduler

and the lock URL in ``$MULTILOCK_LOCK_URL`` (or the setting ``beat_multilock_url``).
Before a due entry is sent, its tick is locked under ``beat:<entry name>``: the beat
that takes the lock sends the task and keeps the lock until the hold has passed since
the tick; the others skip it. Interval entries (``schedule(timedelta(...))`` or a number
of seconds) fire on multiples of their interval since the epoch, so that every replica
has the same ticks (beat alone counts from each process's start); any other schedule's
tick is the minute it fires in (crontab's resolution). The task carries its tick in the
``multilock_tick`` header (:func:`task_tick`).

Settings (``app.conf``): ``beat_multilock_url``; ``beat_multilock_hold`` (default: half
the entry's interval, at most 30 s; a crontab's interval counts as a minute);
``beat_multilock_skew_tolerance`` (default 250 ms). A hold must be longer than twice the
skew tolerance, and with twice the tolerance at most the entry's interval (a crontab's
counts as a minute): beat refuses to start otherwise.
"""

from __future__ import annotations

import copy
import logging
import os
import time
from datetime import UTC, datetime
from typing import Any

from .._durations import parse_duration
from .._locks.holds import hold as hold_lock
from .._locks.registry import connect
from .._scheduling.per_tick import may_run, shown_tick
from .._scheduling.ticks import check_hold, tick_of
from ..abc import DistributedLock
from ..errors import BackendUnavailable, ConfigurationError

try:
    from celery.beat import PersistentScheduler
    from celery.schedules import schedstate, schedule
    from celery.utils.time import maybe_make_aware
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError(
        "multilock.integrations.celery needs Celery: pip install 'multilock[celery]'"
    ) from exc

__all__ = ["OncePerTick", "Scheduler", "task_tick"]

log = logging.getLogger("multilock.once")
LOCK_URL_ENV = "MULTILOCK_LOCK_URL"
TICK_HEADER = "multilock_tick"
_MAX_DEFAULT_HOLD = 30.0
_MIN_WAIT = 0.02


def _interval(entry: Any) -> float | None:
    """The seconds between an interval entry's ticks; ``None`` for other schedules."""
    if type(entry.schedule) is schedule:
        return float(entry.schedule.run_every.total_seconds())
    return None


class OncePerTick:
    """The beat scheduler mixin: put it before your scheduler class
    (``class MyScheduler(OncePerTick, PersistentScheduler)``). :class:`Scheduler` is
    it with Celery's default ``PersistentScheduler``."""

    app: Any
    schedule: Any
    _multilock: DistributedLock | None = None
    _holds: dict[str, float]

    def setup_schedule(self) -> None:
        """Celery's, then every entry's hold checked: a hold that cannot work stops
        beat at start with one line, not at the first tick."""
        super().setup_schedule()  # type: ignore[misc]
        skew = self.app.conf.get("beat_multilock_skew_tolerance") or 0.25
        self._skew = parse_duration(skew, what="beat_multilock_skew_tolerance")
        self._holds = {}
        for entry in self.schedule.values():
            try:
                self._holds[entry.name] = self._hold_of(entry)
            except ConfigurationError as exc:
                raise ConfigurationError(f"beat entry {entry.name!r}: {exc}") from None

    def _hold_of(self, entry: Any) -> float:
        """The entry's hold: the setting, or half its interval (a crontab's: a minute)
        at most 30 s; checked against its interval."""
        every = _interval(entry) or 60.0
        held = self.app.conf.get("beat_multilock_hold") or min(_MAX_DEFAULT_HOLD, every / 2)
        return check_hold(held, self._skew, every)[0]

    def is_due(self, entry: Any) -> Any:
        """Interval entries are due on multiples of their interval since the epoch, on
        every replica alike; other schedules as Celery computes them."""
        every = _interval(entry)
        if every is None:
            return super().is_due(entry)  # type: ignore[misc]
        now = time.time()
        current = tick_of(now, every)
        last = maybe_make_aware(entry.last_run_at).timestamp()
        # At least 20 ms: beat sleeps this less its 10 ms drift, and a negative sleep fails.
        return schedstate(last < current, max(current + every - now, _MIN_WAIT))

    def apply_entry(self, entry: Any, producer: Any = None) -> None:
        """Send ``entry``'s task if this beat takes its tick, in time."""
        every = _interval(entry)
        tick = tick_of(time.time(), every if every is not None else "minute")
        held = self._holds.get(entry.name)
        if held is None:  # an entry added since setup_schedule
            held = self._holds[entry.name] = self._hold_of(entry)
        name = f"beat:{entry.name}"
        try:
            with hold_lock(self._locker(), name, at_least=held, since=tick) as lease:
                if may_run(name, lease is not None, tick, held, self._skew):
                    sent = copy.copy(entry)
                    headers = {**sent.options.get("headers", {}), TICK_HEADER: shown_tick(tick)}
                    sent.options = {**sent.options, "headers": headers}
                    super().apply_entry(sent, producer=producer)  # type: ignore[misc]
        except BackendUnavailable as exc:  # an outage misses ticks; it must not stop beat
            log.warning("%s: tick %s missed: %s", name, shown_tick(tick), exc)

    def _locker(self) -> DistributedLock:
        if self._multilock is None:
            url = self.app.conf.get("beat_multilock_url") or os.environ.get(LOCK_URL_ENV)
            if not url:
                raise ConfigurationError(
                    f"no lock URL: set beat_multilock_url or ${LOCK_URL_ENV} for celery beat"
                )
            self._multilock = connect(url)
        return self._multilock

    def close(self) -> None:
        """Celery's, then the locker's (the holds still running end with it)."""
        super().close()  # type: ignore[misc]
        if self._multilock is not None:
            self._multilock.close()
            self._multilock = None


class Scheduler(OncePerTick, PersistentScheduler):  # type: ignore[misc]
    """Celery's default beat scheduler, sending each tick of an entry from one replica:
    ``celery beat -S multilock.integrations.celery:Scheduler``."""


def task_tick(request: Any) -> datetime | None:
    """The tick a task sent by :class:`Scheduler` runs for (``self.request`` in a bound
    task); ``None`` for a task sent otherwise."""
    value = getattr(request, TICK_HEADER, None)
    if value is None:
        value = (getattr(request, "headers", None) or {}).get(TICK_HEADER)
    return None if value is None else datetime.fromisoformat(value).astimezone(UTC)
