"""What the scheduler tells listeners and logs about each run."""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from ..errors import BackendUnavailable, ConfigurationError

__all__ = ["EventKind", "JobEvent", "Listener", "emit", "missed_cause", "wanted"]

log = logging.getLogger("multilock.scheduler")


class EventKind(enum.StrEnum):
    """The outcome (or start) of one tick of one job; also the ``outcome`` metric label."""

    STARTED = "started"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    """The job raised (``error``), or its lock was refused as bad input (a name too long
    for the backend...)."""
    TIMED_OUT = "timed_out"
    SKIPPED_HELD = "skipped_held"
    """Another replica holds the job's lease (or leads): normal, logged at DEBUG."""
    SKIPPED_OVERLAP = "skipped_overlap"
    """The previous run in this process is still going and ``overlap="reschedule"``."""
    MISSED = "missed"
    """The tick did not run: too late (misfire grace passed), coalesced away, or its
    lock could not be asked for (``error`` is the ``BackendUnavailable``)."""
    LEASE_LOST = "lease_lost"
    """The lease (or leadership) was lost during the run, which was cancelled."""


@dataclass(frozen=True)
class JobEvent:
    """One event of one tick: ``kind``, the job, its scheduled fire time, and details."""

    kind: EventKind
    job: str
    fire_time: datetime
    replica_id: str
    duration: float | None = None
    """Run time in seconds (outcomes of runs that started)."""
    delay: float | None = None
    """Seconds between the fire time and the start (``started``)."""
    error: BaseException | None = None
    """The exception of ``failed``; the ``BackendUnavailable`` of a ``missed`` tick."""
    reason: str | None = None
    """Why a tick was skipped, missed or lost."""
    tick_path: str | None = None
    """How the tick was made to run once across replicas: ``"claim"`` (claimed on the
    backend), ``"hold"`` (the lock held past the tick), ``"leader"`` or ``"local"``."""


Listener = Callable[[JobEvent], object]
"""A callable given every :class:`JobEvent`; called on the scheduler's event loop."""

_LEVELS = {
    EventKind.STARTED: logging.DEBUG,
    EventKind.SUCCEEDED: logging.INFO,
    EventKind.FAILED: logging.ERROR,
    EventKind.TIMED_OUT: logging.WARNING,
    EventKind.SKIPPED_HELD: logging.DEBUG,
    EventKind.SKIPPED_OVERLAP: logging.WARNING,
    EventKind.MISSED: logging.WARNING,
    EventKind.LEASE_LOST: logging.ERROR,
}


def _traced(event: JobEvent) -> bool:
    error = event.error
    return (
        event.kind is EventKind.FAILED
        and error is not None
        and not isinstance(error, ConfigurationError)
    )


def wanted(kind: EventKind, listeners: list[Listener]) -> bool:
    """Whether an event of ``kind`` would be seen: a listener, or its log level enabled."""
    return bool(listeners) or log.isEnabledFor(_LEVELS[kind])


def missed_cause(event: JobEvent) -> str:
    """Why a ``missed`` tick was missed: ``backend_unavailable`` (its lock could not be
    asked), ``coalesced`` (a later tick ran instead) or ``late`` (past its grace)."""
    if isinstance(event.error, BackendUnavailable):
        return "backend_unavailable"
    return "coalesced" if event.reason == "coalesced" else "late"


def emit(event: JobEvent, listeners: list[Listener], *, logged: bool = True) -> None:
    """Log ``event`` (unless not ``logged``: a repeat reported elsewhere) with structured
    fields, then hand it to every listener. Only a job's own failure gets a traceback."""
    level = _LEVELS[event.kind]
    if logged and log.isEnabledFor(level):
        fields = {
            "job": event.job,
            "fire_time": event.fire_time.isoformat(),
            "replica_id": event.replica_id,
            "outcome": event.kind.value,
            "duration": event.duration,
            "tick_path": event.tick_path,
        }
        detail = f" in {event.duration:.3f}s" if event.duration is not None else ""
        if event.reason:
            detail += f" ({event.reason})"
        error = event.error
        log.log(
            level,
            "job %s tick %s %s%s",
            event.job,
            fields["fire_time"],
            event.kind.value,
            detail,
            extra=fields,
            exc_info=error if error is not None and _traced(event) else None,
        )
    for listener in listeners:
        try:
            listener(event)
        except Exception:  # a listener's bug must not stop the scheduler or the others
            log.exception("scheduler listener %r raised", listener)
