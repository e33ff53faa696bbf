"""What ``multilock jobs`` and the ``/jobs`` endpoint show of a scheduler's jobs."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Any

from .._masking import mask_text
from .._scheduling.events import EventKind, JobEvent
from .._scheduling.jobs import Job
from .._scheduling.scheduler import Scheduler

__all__ = ["LastOutcomes", "job_rows"]


class LastOutcomes:
    """A scheduler listener keeping each job's last outcome (not its starts)."""

    def __init__(self) -> None:
        self._last: dict[str, JobEvent] = {}
        self._at: dict[str, datetime] = {}
        self._lock = threading.Lock()  # read from the HTTP server's threads

    def __call__(self, event: JobEvent) -> None:
        """Record ``event`` unless it is a start."""
        if event.kind is not EventKind.STARTED:
            with self._lock:
                self._last[event.job] = event
                self._at[event.job] = datetime.now(UTC)

    def of(self, job: str) -> dict[str, Any] | None:
        """The last outcome of ``job`` as JSON-ready fields, or ``None`` if none yet."""
        with self._lock:
            event, at = self._last.get(job), self._at.get(job)
        if event is None or at is None:
            return None
        return {
            "outcome": event.kind.value,
            "fire_time": event.fire_time.astimezone(UTC).isoformat(),
            "replica": event.replica_id,
            "at": at.isoformat(timespec="seconds"),
            "duration": event.duration,
            "reason": mask_text(event.reason) if event.reason else None,
        }


def job_rows(
    scheduler: Scheduler, count: int, outcomes: LastOutcomes | None = None
) -> list[dict[str, Any]]:
    """Each job of ``scheduler``: name, trigger, mode, its next ``count`` fire times
    (UTC, ISO 8601) and, with ``outcomes``, its last outcome."""
    now = datetime.now(UTC)
    rows = []
    for job in scheduler.jobs:
        fires: list[str] = []
        after = now
        while len(fires) < count and (fire := job.next_fire(after)) is not None:
            fires.append(fire.astimezone(UTC).isoformat())
            after = fire
        rows.append(
            {
                "name": job.name,
                "trigger": repr(job.trigger),
                "timezone": str(job.timezone),
                "mode": _mode(scheduler, job),
                "next": fires,
                "last": outcomes.of(job.name) if outcomes is not None else None,
            }
        )
    return rows


def _mode(scheduler: Scheduler, job: Job) -> str:
    """``local``, ``leader``, ``lock+claim`` (ticks claimed) or ``lock+hold``."""
    path = scheduler.tick_path(job)
    return path if path in ("local", "leader") else f"lock+{path}"
