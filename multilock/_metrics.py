"""Prometheus metrics of job runs (extra ``multilock[metrics]``), fed by the events.

Without ``prometheus-client`` installed, metrics are off and nothing fails.
Metric objects are made once per registry: several schedulers in one process
share them, labelled by job.
"""

from __future__ import annotations

import threading
from typing import Any

from ._events import EventKind, JobEvent, Listener

__all__ = ["metrics_listener"]

_made: dict[int, tuple[Any, Any, Any, Any, Any]] = {}
_guard = threading.Lock()


def _metrics_for(registry: Any) -> tuple[Any, Any, Any, Any, Any]:
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
                    "Seconds from the scheduled fire time to the start of the run.",
                    ["job"],
                    registry=registry,
                ),
            )
            _made[id(registry)] = made
    return made


def metrics_listener(registry: Any = None) -> Listener | None:
    """A listener recording runs into ``registry`` (default: the global one), or
    ``None`` when prometheus-client is not installed."""
    try:
        _, last_success, runs, duration, delay = _metrics_for(registry)
    except ImportError:
        return None

    def record(event: JobEvent) -> None:
        if event.kind is EventKind.STARTED:
            if event.delay is not None:
                delay.labels(event.job).observe(max(event.delay, 0.0))
            return
        runs.labels(event.job, event.kind.value).inc()
        if event.duration is not None:
            duration.labels(event.job).observe(event.duration)
        if event.kind is EventKind.SUCCEEDED:
            last_success.labels(event.job).set_to_current_time()

    return record
