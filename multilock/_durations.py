"""Durations as users write them: ``30``, ``1.5``, ``"250ms"``, ``"1h30m"``, timedelta."""

from __future__ import annotations

import math
import re
from datetime import timedelta

from .errors import ConfigurationError

__all__ = ["Duration", "parse_duration"]

Duration = float | int | str | timedelta
"""What multilock accepts wherever it asks for a duration."""

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_WHOLE = re.compile(r"(?:\d+(?:\.\d+)?(?:ms|s|m|h|d))+")


def parse_duration(value: object, *, what: str = "duration") -> float:
    """Return ``value`` as a number of seconds, > 0 and finite.

    Accepts numbers (seconds), :class:`~datetime.timedelta`, and strings such
    as ``"30s"``, ``"5m"``, ``"1h30m"``, ``"250ms"``, ``"2d"`` or ``"1.5"``.
    Anything else raises :class:`~multilock.errors.ConfigurationError` naming
    ``what`` and the bad value.
    """
    seconds: float
    if isinstance(value, bool):
        raise ConfigurationError(f"invalid {what}: {value!r} is a boolean, not a duration")
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().lower().replace(" ", "")
        try:
            seconds = float(text)
        except ValueError:
            if not _WHOLE.fullmatch(text):
                raise ConfigurationError(
                    f"invalid {what}: {value!r} (expected seconds or a form like"
                    " '250ms', '30s', '5m', '1h30m', '2d')"
                ) from None
            seconds = sum(float(n) * _UNITS[u] for n, u in _PART.findall(text))
    else:
        raise ConfigurationError(
            f"invalid {what}: {value!r} is a {type(value).__name__}, not a duration"
        )
    if not math.isfinite(seconds) or seconds <= 0:
        raise ConfigurationError(f"invalid {what}: {value!r} must be positive and finite")
    return seconds
