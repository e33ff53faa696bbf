"""Wall-clock times in a timezone, and the DST policy that turns them into instants.

The policy, the same for every calendar trigger (cron, daily, weekly, monthly,
once with a naive time):

* a wall time that does not exist (the spring-forward gap) fires once, at the
  first instant after the gap -- the transition itself;
* a wall time that happens twice (the fall-back repeated hour) fires once, at
  its first occurrence.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ..errors import ConfigurationError

__all__ = ["as_timezone", "local_naive", "resolve_wall_time"]


def as_timezone(value: object, *, what: str = "timezone") -> ZoneInfo:
    """``value`` (an IANA name or a :class:`~zoneinfo.ZoneInfo`) as a ZoneInfo, or a clear error."""
    if isinstance(value, ZoneInfo):
        return value
    if not isinstance(value, str) or not value.strip():
        raise ConfigurationError(f"invalid {what}: {value!r} (expected an IANA name like 'UTC')")
    try:
        return ZoneInfo(value.strip())
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigurationError(
            f"unknown {what} {value!r} (expected an IANA name like 'Europe/Kyiv')"
        ) from None


def local_naive(instant: datetime, tz: ZoneInfo) -> datetime:
    """The wall time (naive) that ``instant`` shows in ``tz``."""
    return instant.astimezone(tz).replace(tzinfo=None)


def resolve_wall_time(wall: datetime, tz: ZoneInfo) -> datetime:
    """The UTC instant at which naive ``wall`` fires in ``tz``, under the DST policy."""
    first = wall.replace(tzinfo=tz, fold=0).astimezone(UTC)
    second = wall.replace(tzinfo=tz, fold=1).astimezone(UTC)
    if local_naive(first, tz) == wall:
        # Exists; when it exists twice, fold=0 is the first occurrence (the earlier instant).
        return min(first, second) if local_naive(second, tz) == wall else first
    # In a gap: fold=1 reads it with the post-transition offset and lands before the
    # gap, fold=0 lands after it. The transition lies between; find it to the second.
    low, high = min(first, second), max(first, second)
    offset_before = low.astimezone(tz).utcoffset()
    while high - low > timedelta(seconds=1):
        middle = low + (high - low) / 2
        if middle.astimezone(tz).utcoffset() == offset_before:
            low = middle
        else:
            high = middle
    return high.replace(microsecond=0) if high.microsecond else high
