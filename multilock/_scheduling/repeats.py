"""One log line for a problem that repeats: the first time in full, then a count.

A backend that is down fails every tick of every job and every probe, each with the
same message: an operator needs to see it once, to know that it goes on, and to see
when it ends -- not a line (or a traceback) per tick.
"""

from __future__ import annotations

import logging
from collections import Counter

from .clock import Clock

__all__ = ["Repeats"]


class Repeats:
    """Collapses repeats of one problem (a key, such as an error message) into counts.

    :meth:`report` tells whether an occurrence is the first of its problem (its caller
    logs that one); later ones with the same key are counted (by what they were:
    "ticks missed", "probes failed"...) and summed up in one line every ``every``
    seconds while it lasts, and in one line when it changes or :meth:`clear` says it
    is over. Used from the scheduler's event loop only.
    """

    def __init__(self, logger: logging.Logger, clock: Clock, every: float = 60.0) -> None:
        self._log = logger
        self._clock = clock
        self._every = every
        self._key: str | None = None
        self._since = 0.0
        self._summed = 0.0  # when the counts were last logged
        self._counts: Counter[str] = Counter()

    @property
    def current(self) -> str | None:
        """The key of the problem going on, or ``None``."""
        return self._key

    def report(self, key: str, what: str) -> bool:
        """One more occurrence of problem ``key``: ``True`` if it is new (the caller
        logs it, in full); else it is counted as one more ``what`` ("ticks missed"...),
        the counts logged every ``every`` seconds while it lasts, and ``False``."""
        now = self._clock.now()
        if key != self._key:
            if self._key is not None:
                self._flush("then another problem", logging.WARNING, now)
            self._key, self._since, self._summed = key, now, now
            return True
        self._counts[what] += 1
        if now - self._summed >= self._every:
            self._flush("still going on", logging.WARNING, now)
            self._summed = now
        return False

    def clear(self, message: str, key: str | None = None) -> None:
        """The problem (``key``, or whatever goes on) is over: one INFO line saying so
        (``message``), with what was counted since its first line."""
        if self._key is None or (key is not None and key != self._key):
            return
        self._flush(message, logging.INFO, self._clock.now(), always=True)
        self._key = None

    def _flush(self, prefix: str, level: int, now: float, *, always: bool = False) -> None:
        if not self._counts and not always:
            return
        counted = "".join(f", {count} more {what}" for what, count in self._counts.items())
        self._log.log(
            level,
            "%s after %.1fs%s: %s",
            prefix,
            now - self._since,
            counted,
            self._key,
        )
        self._counts.clear()
