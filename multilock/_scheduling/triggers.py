"""Triggers: when a job fires. Every replica computes the same fire times.

A trigger maps "the last instant considered" to the next fire time, as an
aware UTC datetime, given the job's timezone and a seed (the job name, which
makes jitter identical on every replica). Calendar triggers work in wall
time and resolve it with the DST policy of :mod:`multilock._scheduling.walltime`;
:func:`every` works in absolute time and ignores DST.
"""

from __future__ import annotations

import hashlib
import re
import weakref
from collections.abc import Callable, Iterable
from datetime import UTC, date, datetime, time, timedelta
from typing import Protocol
from zoneinfo import ZoneInfo

from .._durations import Duration, parse_duration
from ..errors import ConfigurationError
from .walltime import local_naive, resolve_wall_time

__all__ = ["Trigger", "cron", "daily", "every", "monthly", "once", "weekly"]

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_WEEKDAYS = {"mon": 0, "tue": 1, "wed": 2, "thu": 3, "fri": 4, "sat": 5, "sun": 6}
_MAX_CRON_STEPS = 100_000  # a per-second cron crossing a repeated hour needs ~3,600


class Trigger(Protocol):
    """When a job fires: implement :meth:`next_fire` to write your own."""

    def next_fire(self, after: datetime, tz: ZoneInfo, seed: str) -> datetime | None:
        """The first fire time strictly after ``after`` (aware), or ``None`` if there is none.

        Must be a pure function of its arguments: replicas rely on computing
        the same answer.
        """


class IntervalTrigger:
    """Fires at ``start + n * interval`` (+ a per-tick jitter in ``[0, jitter)``)."""

    def __init__(self, interval: timedelta, start: datetime, jitter: timedelta) -> None:
        self.interval = interval
        self.start = start
        self.jitter = jitter
        # The last tick answered (without jitter): asked for the tick after it, as the
        # scheduler asks at every run, the answer is one interval on, without the
        # division and multiplication of timedeltas (their exact integer arithmetic
        # is most of this method's cost). Any tick answered is on the grid, whichever
        # thread reads it, so the shortcut needs no lock.
        self._last: datetime | None = None

    def next_fire(self, after: datetime, tz: ZoneInfo, seed: str) -> datetime | None:
        """The first ``start + n * interval + jitter(n)`` after ``after``."""
        last = self._last
        if last is not None and after == last:
            self._last = following = last + self.interval
            return following
        if after < self.start:
            return self._fire(0, seed)
        n = (after - self.start) // self.interval
        if not self.jitter:  # tick n is at or before ``after``: the next one is n + 1
            self._last = following = self.start + (n + 1) * self.interval
            return following
        current = self._fire(n, seed)
        return current if current > after else self._fire(n + 1, seed)

    def _fire(self, n: int, seed: str) -> datetime:
        fire = self.start + n * self.interval
        if self.jitter:
            digest = hashlib.blake2b(f"{seed}\0{n}".encode(), digest_size=8).digest()
            span = self.jitter // timedelta(microseconds=1)
            fire += timedelta(microseconds=int.from_bytes(digest, "big") % span)
        return fire

    def __repr__(self) -> str:
        jitter = f", jitter={self.jitter}" if self.jitter else ""
        return f"every({self.interval}, start={self.start.isoformat()}{jitter})"


def every(
    interval: Duration | None = None,
    *,
    milliseconds: float = 0,
    seconds: float = 0,
    minutes: float = 0,
    hours: float = 0,
    days: float = 0,
    weeks: float = 0,
    start: datetime | None = None,
    jitter: Duration | None = None,
) -> IntervalTrigger:
    """Fire every ``interval`` (or the sum of the keyword units, ``milliseconds`` to
    ``weeks``) in absolute time; at least one millisecond.

    Ticks are anchored at ``start`` (an aware datetime; default the Unix
    epoch), so every replica computes the same ones whenever it started.
    ``jitter`` delays each tick by a pseudo-random amount below it, derived
    from the job name and the tick number: spread out, yet the same on every
    replica. DST does not move interval ticks; use :func:`daily` for wall time.
    """
    parts = {
        "milliseconds": milliseconds,
        "seconds": seconds,
        "minutes": minutes,
        "hours": hours,
        "days": days,
        "weeks": weeks,
    }
    for unit, amount in parts.items():
        if isinstance(amount, bool) or not isinstance(amount, int | float) or amount < 0:
            raise ConfigurationError(f"invalid every({unit}={amount!r}): expected a number >= 0")
    summed = timedelta(**parts)
    if interval is not None:
        if summed:
            raise ConfigurationError("every() takes an interval or keyword units, not both")
        summed = timedelta(seconds=parse_duration(interval, what="interval"))
    if summed < timedelta(milliseconds=1):
        raise ConfigurationError(f"invalid every() interval {summed}: must be at least 1ms")
    if start is None:
        start = EPOCH
    elif not isinstance(start, datetime) or start.tzinfo is None:
        raise ConfigurationError(f"every(start={start!r}) must be an aware datetime")
    spread = timedelta(0)
    if jitter is not None:
        spread = timedelta(seconds=parse_duration(jitter, what="jitter"))
        if spread >= summed:
            raise ConfigurationError(f"jitter {spread} must be shorter than the interval {summed}")
    return IntervalTrigger(summed, start.astimezone(UTC), spread)


class _WallTrigger:
    """A trigger defined by a sequence of wall times; subclasses yield them."""

    __slots__ = ()

    def _walls_after(self, wall: datetime) -> Iterable[datetime]:
        raise NotImplementedError

    def next_fire(self, after: datetime, tz: ZoneInfo, seed: str) -> datetime | None:
        """The first wall time after ``after`` whose resolved instant is later than it."""
        for wall in self._walls_after(local_naive(after, tz)):
            instant = resolve_wall_time(wall, tz)
            # In a repeated hour, wall times already seen resolve to the first
            # occurrence, i.e. before ``after``: skipping them is the policy.
            if instant > after:
                return instant
        return None


class CronTrigger(_WallTrigger):
    """A cron expression (croniter), read in the job's timezone.

    One instance per distinct expression (:func:`parse_cron` shares them), which
    remembers its last answer in UTC: with no DST, a cron's fire times are a fixed
    set, so the next one after any instant of ``[after, answer)`` is ``answer``; the
    jobs of a large registry that share an expression (``0 3 * * *``) then compute it
    once, not once each, and croniter is the cost of adding and starting them.
    """

    __slots__ = ("__weakref__", "_last", "expr", "gap_memo", "seconds")

    def __init__(self, expr: str, seconds: bool) -> None:
        self.expr = expr
        self.seconds = seconds
        self._last: tuple[datetime, datetime] | None = None  # in UTC: (after, its next fire)
        self.gap_memo: tuple[ZoneInfo, datetime, timedelta | None] | None = None
        """The validation's last answer (``jobs.validate_schedule``): (tz, first, shortest gap)."""

    def next_fire(self, after: datetime, tz: ZoneInfo, seed: str) -> datetime | None:
        """The first fire time after ``after`` (see :meth:`_WallTrigger.next_fire`)."""
        if tz.key != "UTC":
            return super().next_fire(after, tz, seed)
        last = self._last
        if last is not None and last[0] <= after < last[1]:
            return last[1]
        following = super().next_fire(after, tz, seed)
        if following is not None:
            self._last = (after, following)
        return following

    def next_fires(self, after: datetime, tz: ZoneInfo, count: int) -> list[datetime]:
        """The next ``count`` fire times after ``after`` (fewer if the cron ends): what
        :meth:`next_fire` would give one after the other, in UTC in one croniter walk."""
        if tz.key != "UTC":
            fires: list[datetime] = []
            following = self.next_fire(after, tz, "")
            while following is not None and len(fires) < count:
                fires.append(following)
                following = self.next_fire(following, tz, "")
            return fires
        walls = self._walls_after(after.astimezone(UTC).replace(tzinfo=None))
        return [wall.replace(tzinfo=UTC) for wall, _ in zip(walls, range(count), strict=False)]

    def _walls_after(self, wall: datetime) -> Iterable[datetime]:
        from croniter import CroniterBadDateError, croniter

        it = croniter(self.expr, wall, second_at_beginning=self.seconds)
        try:
            for _ in range(_MAX_CRON_STEPS):
                yield it.get_next(datetime)
        except CroniterBadDateError:
            return

    def __repr__(self) -> str:
        return f"cron({self.expr!r}{', seconds=True' if self.seconds else ''})"


# The nicknames of Vixie cron, as croniter reads them (@reboot has no tick to lock).
_ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
# Each field's name and the values it takes (day of week: 0 and 7 are Sunday).
_FIELDS = (
    ("minute", 0, 59),
    ("hour", 0, 23),
    ("day of month", 1, 31),
    ("month", 1, 12),
    ("day of week", 0, 7),
)
_SECOND = ("second", 0, 59)


def cron(expr: str, *, seconds: bool = False) -> CronTrigger:
    """A cron expression: 5 fields, or 6 with ``seconds=True`` (seconds first, as in Quartz
    and gocron's ``WithSeconds``), or an alias (``@hourly``, ``@daily``, ``@weekly``,
    ``@monthly``, ``@yearly``). Read in the job's timezone, with the DST policy."""
    return parse_cron(expr, seconds=seconds, flag="seconds=True")


def parse_cron(expr: str, *, seconds: bool, flag: str) -> CronTrigger:
    """:func:`cron`, with errors that name ``flag`` as the caller spells it (``--seconds``)."""
    if not isinstance(expr, str):
        raise ConfigurationError(f"a cron expression must be a str, not {type(expr).__name__}")
    text = expr.strip()
    if text.startswith("@"):
        alias = _ALIASES.get(text.lower())
        if alias is None:
            raise ConfigurationError(
                f"invalid cron expression {expr!r}: unknown alias (known: {', '.join(_ALIASES)})"
            )
        text = f"0 {alias}" if seconds else alias
    fields = text.split()
    want = 6 if seconds else 5
    if len(fields) != want:
        hint = ""
        if not seconds and len(fields) == 6:
            hint = f" (pass {flag} for a seconds field first)"
        elif seconds and len(fields) == 5:
            hint = f" ({flag} expects a seconds field first)"
        raise ConfigurationError(
            f"invalid cron expression {expr!r}: {len(fields)} fields, expected {want}{hint}"
        )
    normal = " ".join(fields)
    shared = _CRONS.get((normal, seconds))
    if shared is not None:
        return shared
    # Imported here, not with the module: most schedulers hold no cron job, and croniter
    # (with dateutil) is a tenth of what ``import multilock`` would load and keep.
    from croniter import croniter

    if not croniter.is_valid(text, second_at_beginning=seconds):
        raise ConfigurationError(f"invalid cron expression {expr!r}: {_why(fields, seconds)}")
    trigger = _CRONS[(normal, seconds)] = CronTrigger(normal, seconds)
    return trigger


# The triggers of the expressions in use, shared (see CronTrigger); gone with their jobs.
_CRONS: weakref.WeakValueDictionary[tuple[str, bool], CronTrigger] = weakref.WeakValueDictionary()


def _why(fields: list[str], seconds: bool) -> str:
    """Which field of an expression croniter refuses, and why."""
    from croniter import croniter

    specs = (_SECOND, *_FIELDS) if seconds else _FIELDS
    for index, ((name, low, high), text) in enumerate(zip(specs, fields, strict=True)):
        alone = ["*"] * len(fields)
        alone[index] = text
        if croniter.is_valid(" ".join(alone), second_at_beginning=seconds):
            continue
        for number in re.findall(r"(?<![/#\w])\d+", text):  # values, not steps nor nth
            if not low <= int(number) <= high:
                return f"{name} {int(number)} out of {low}\u2013{high}"
        return f"{name} field {text!r} is not valid"
    return "croniter refuses it"  # every field alone is valid: their combination is not


class CalendarTrigger(_WallTrigger):
    """Fires at given wall times on the days a predicate accepts (daily/weekly/monthly)."""

    def __init__(self, times: tuple[time, ...], days: Callable[[date], bool], label: str) -> None:
        self.times = times
        self.days = days
        self.label = label

    def _walls_after(self, wall: datetime) -> Iterable[datetime]:
        day = wall.date()
        for _ in range(5 * 366):
            if self.days(day):
                for at in self.times:
                    candidate = datetime.combine(day, at)
                    if candidate > wall:
                        yield candidate
            day += timedelta(days=1)

    def __repr__(self) -> str:
        return self.label


def _times(at: str | time | Iterable[str | time], what: str) -> tuple[time, ...]:
    items = [at] if isinstance(at, str | time) else list(at)
    if not items:
        raise ConfigurationError(f"{what}: at= needs at least one time")
    parsed = []
    for item in items:
        if isinstance(item, time):
            if item.tzinfo is not None:
                raise ConfigurationError(f"{what}: at={item!r} must be naive (the job has a tz)")
            parsed.append(item)
            continue
        try:
            parsed.append(time.fromisoformat(str(item)))
        except ValueError:
            raise ConfigurationError(
                f"{what}: invalid time {item!r} (expected 'HH:MM' or 'HH:MM:SS')"
            ) from None
    return tuple(sorted(set(parsed)))


def daily(
    at: str | time | Iterable[str | time] = "00:00",
    *,
    every: int = 1,
    start: date | None = None,
) -> CalendarTrigger:
    """Every ``every`` days (counted from ``start``, default 1970-01-01) at wall times ``at``."""
    times = _times(at, "daily()")
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ConfigurationError(f"daily(every={every!r}) must be a whole number of days >= 1")
    anchor = start or date(1970, 1, 1)
    return CalendarTrigger(
        times,
        lambda day: (day - anchor).days % every == 0,
        f"daily(at={[t.isoformat() for t in times]}, every={every})",
    )


def weekly(
    on: str | int | Iterable[str | int], at: str | time | Iterable[str | time] = "00:00"
) -> CalendarTrigger:
    """On the weekdays ``on`` ('mon'..'sun' or 0..6, Monday is 0) at the wall times ``at``."""
    items = [on] if isinstance(on, str | int) else list(on)
    days: set[int] = set()
    for item in items:
        day = _WEEKDAYS.get(item.strip().lower()[:3]) if isinstance(item, str) else item
        if day is None or isinstance(day, bool) or day not in range(7):
            raise ConfigurationError(f"weekly(): invalid weekday {item!r} (expected 'mon'..'sun')")
        days.add(day)
    if not days:
        raise ConfigurationError("weekly(): on= needs at least one weekday")
    times = _times(at, "weekly()")
    return CalendarTrigger(
        times, lambda d: d.weekday() in days, f"weekly(on={sorted(days)}, at={list(times)})"
    )


def monthly(
    on: int | Iterable[int], at: str | time | Iterable[str | time] = "00:00"
) -> CalendarTrigger:
    """On the days of the month ``on`` (1..31; -1 is the last day) at the wall times ``at``.

    A day a month does not have (31 in April) is skipped in that month.
    """
    items = [on] if isinstance(on, int) else list(on)
    for item in items:
        if isinstance(item, bool) or not isinstance(item, int) or not (1 <= abs(item) <= 31):
            raise ConfigurationError(f"monthly(): invalid day {item!r} (expected 1..31 or -1..-31)")
    if not items:
        raise ConfigurationError("monthly(): on= needs at least one day")
    wanted = set(items)

    def matches(day: date) -> bool:
        from_end = (day.replace(day=28) + timedelta(days=4)).replace(day=1) - day  # >= 1 day
        return day.day in wanted or -from_end.days in wanted

    times = _times(at, "monthly()")
    return CalendarTrigger(times, matches, f"monthly(on={sorted(wanted)}, at={list(times)})")


class OnceTrigger:
    """Fires once, at ``at`` (an aware instant, or a wall time read in the job's timezone)."""

    def __init__(self, at: datetime) -> None:
        self.at = at

    def next_fire(self, after: datetime, tz: ZoneInfo, seed: str) -> datetime | None:
        """``at`` if it is after ``after``, else ``None``."""
        instant = self.at.astimezone(UTC) if self.at.tzinfo else resolve_wall_time(self.at, tz)
        return instant if instant > after else None

    def __repr__(self) -> str:
        return f"once(at={self.at.isoformat()})"


def once(at: datetime | str) -> OnceTrigger:
    """Fire once at ``at``: an aware datetime, or a naive one / ISO string in the job's timezone."""
    if isinstance(at, str):
        try:
            at = datetime.fromisoformat(at)
        except ValueError:
            message = f"once(): invalid date-time {at!r} (expected ISO 8601)"
            raise ConfigurationError(message) from None
    if not isinstance(at, datetime):
        raise ConfigurationError(f"once(at={at!r}) must be a datetime or an ISO 8601 string")
    return OnceTrigger(at)
