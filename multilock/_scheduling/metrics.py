"""Prometheus metrics of job runs (extra ``multilock[metrics]``), fed by the events.

Without ``prometheus-client`` installed, metrics are off and nothing fails.
Metric objects are made once per registry: several schedulers in one process
share them, labelled by job.
"""

from __future__ import annotations

import threading
from typing import Any

from .events import EventKind, JobEvent, missed_cause

__all__ = ["Recorder", "metrics_listener"]

_made: dict[int, tuple[Any, ...]] = {}
_guard = threading.Lock()


def _metrics_for(registry: Any) -> tuple[Any, ...]:
    from prometheus_client import REGISTRY, Counter, Gauge, Histogram

    registry = REGISTRY if registry is None else registry
    with _guard:
        made = _made.get(id(registry))
        if made is None:
            made = (
                registry,  # kept so that its id is not reused while cached
                Gauge(
                    "multilock_job_last_success_timestamp_seconds",
                    "When the job last succeeded on this replica (Unix time).",
                    ["job"],
                    registry=registry,
                ),
                Counter(
                    "multilock_job_runs",
                    "Ticks of the job on this replica, by outcome.",
                    ["job", "outcome"],
                    registry=registry,
                ),
                Histogram(
                    "multilock_job_duration_seconds",
                    "Run time of the job on this replica.",
                    ["job"],
                    registry=registry,
                ),
                Histogram(
                    "multilock_job_schedule_delay_seconds",
                    "Seconds from the scheduled fire time to the start of the run's body.",
                    ["job"],
                    registry=registry,
                ),
                Counter(
                    "multilock_job_missed",
                    "Ticks of the job missed on this replica, by cause"
                    " (late, coalesced, backend_unavailable).",
                    ["job", "cause"],
                    registry=registry,
                ),
                Counter(
                    "multilock_job_worker_waits",
                    "Runs of a sync job whose body waited for a free worker thread"
                    " (the scheduler's max_workers is too small for the jobs due together).",
                    ["job"],
                    registry=registry,
                ),
            )
            _made[id(registry)] = made
    return made


class Recorder:
    """Records runs into Prometheus metrics: a listener of every event, and told of the
    runs that wait for a worker thread (which are not events)."""

    def __init__(self, metrics: tuple[Any, ...]) -> None:
        _, self._success, self._runs, self._duration, self._delay, self._missed, self._waits = (
            metrics
        )

    def __call__(self, event: JobEvent) -> None:
        """Record ``event``."""
        if event.kind is EventKind.STARTED:
            if event.delay is not None:
                self._delay.labels(event.job).observe(max(event.delay, 0.0))
            return
        self._runs.labels(event.job, event.kind.value).inc()
        if event.duration is not None:
            self._duration.labels(event.job).observe(event.duration)
        if event.kind is EventKind.SUCCEEDED:
            self._success.labels(event.job).set_to_current_time()
        elif event.kind is EventKind.MISSED:
            self._missed.labels(event.job, missed_cause(event)).inc()

    def worker_wait(self, job: str) -> None:
        """A run of ``job`` waits for a free worker thread."""
        self._waits.labels(job).inc()


def metrics_listener(registry: Any = None) -> Recorder | None:
    """A recorder of runs into ``registry`` (default: the global one), or ``None`` when
    prometheus-client is not installed."""
    try:
        return Recorder(_metrics_for(registry))
    except ImportError:
        return None
