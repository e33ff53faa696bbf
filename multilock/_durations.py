"""Durations as users write them: ``30``, ``1.5``, ``"250ms"``, ``"1h30m"``, timedelta."""

from __future__ import annotations

import math
import re
import reprlib
from datetime import timedelta

from .errors import ConfigurationError

__all__ = ["MAX_DURATION", "Duration", "parse_duration"]

Duration = float | int | str | timedelta
"""What multilock accepts wherever it asks for a duration."""

MAX_DURATION = 100 * 365.25 * 86400.0
"""The longest duration multilock accepts anywhere: 100 years (3,155,760,000 s).

Past it, a duration stops being representable somewhere it goes (an expiry past
``datetime.max``, a thread wait past ``threading.TIMEOUT_MAX``); a backend may
set a lower limit of its own. Checked before any server is asked."""

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_WHOLE = re.compile(r"(?:\d+(?:\.\d+)?(?:ms|s|m|h|d))+")
_SHOW = reprlib.Repr()
_SHOW.maxlong = _SHOW.maxstring = 40  # a value shown in an error stays one short line


def parse_duration(
    value: object, *, what: str = "duration", maximum: float = MAX_DURATION
) -> float:
    """Return ``value`` as a number of seconds, > 0, finite and at most ``maximum``
    (by default :data:`MAX_DURATION`).

    Accepts numbers (seconds), :class:`~datetime.timedelta`, and strings such
    as ``"30s"``, ``"5m"``, ``"1h30m"``, ``"250ms"``, ``"2d"`` or ``"1.5"``.
    Anything else raises :class:`~multilock.errors.ConfigurationError` naming
    ``what`` and the bad value.
    """
    if type(value) is float and 0.0 < value < math.inf and value <= maximum:
        return value  # the common case (a ttl the scheduler computed), asked per tick
    seconds: float
    if isinstance(value, bool):
        raise ConfigurationError(f"invalid {what}: {value!r} is a boolean, not a duration")
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float):
        if isinstance(value, int) and value > maximum:
            raise _too_long(what, value, maximum)  # before float(), which overflows past 1e308
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().lower().replace(" ", "")
        try:
            seconds = float(text)
        except ValueError:
            if not _WHOLE.fullmatch(text):
                raise ConfigurationError(
                    f"invalid {what}: {_SHOW.repr(value)} (expected seconds or a form like"
                    " '250ms', '30s', '5m', '1h30m', '2d')"
                ) from None
            seconds = sum(float(n) * _UNITS[u] for n, u in _PART.findall(text))
    else:
        raise ConfigurationError(
            f"invalid {what}: {_SHOW.repr(value)} is a {type(value).__name__}, not a duration"
        )
    if not math.isfinite(seconds) or seconds <= 0:
        raise ConfigurationError(f"invalid {what}: {_SHOW.repr(value)} must be positive and finite")
    if seconds > maximum:
        raise _too_long(what, value, maximum)
    return seconds


def _too_long(what: str, value: object, maximum: float) -> ConfigurationError:
    return ConfigurationError(
        f"invalid {what}: {_SHOW.repr(value)} is longer than the maximum of"
        f" {format_seconds(maximum)}"
    )


def format_seconds(seconds: float) -> str:
    """``seconds`` for a message: ``"0.5 s"``, ``"2,147,483.647 s (24.9 days)"``."""
    shown = f"{seconds:,.3f}".rstrip("0").rstrip(".") + " s"
    days = seconds / 86400
    if days >= 365:
        return f"{shown} ({days / 365.25:,.0f} years)"
    return f"{shown} ({days:.1f} days)" if days >= 2 else shown
