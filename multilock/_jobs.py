"""A registered job, its validation, and the context a running job can read."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal
from zoneinfo import ZoneInfo

from ._durations import Duration, parse_duration
from ._triggers import Trigger
from .errors import ConfigurationError

__all__ = ["Job", "Overlap", "RunContext", "current_run"]

Overlap = Literal["reschedule", "wait"]
_SAMPLES = 32  # fire times looked at to find a trigger's shortest gap


@dataclass(frozen=True)
class Job:
    """A job as registered: what runs, when, and under which lock name."""

    name: str
    """The lock name; also the ``job`` of events, logs and metrics."""
    func: Callable[..., Any]
    trigger: Trigger
    timezone: ZoneInfo
    timeout: float | None
    overlap: Overlap
    distributed: bool
    misfire_grace: float
    coalesce: bool
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    @property
    def is_async(self) -> bool:
        """Whether ``func`` is a coroutine function (else it runs in a worker thread)."""
        func: Any = self.func
        while isinstance(func, functools.partial):
            func = func.func
        return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(
            getattr(func, "__call__", None)  # noqa: B004 - async callable objects
        )

    def next_fire(self, after: datetime) -> datetime | None:
        """The job's first fire time strictly after ``after``."""
        return self.trigger.next_fire(after, self.timezone, self.name)


def validate_schedule(job: Job, now: datetime, skew_tolerance: float) -> None:
    """Refuse a trigger that never fires, or fires faster than ``skew_tolerance`` allows."""
    try:
        first = job.next_fire(now)
    except (ValueError, OverflowError, TypeError) as exc:
        raise ConfigurationError(f"job {job.name!r}: trigger {job.trigger!r} fails: {exc}") from exc
    if first is None:
        raise ConfigurationError(f"job {job.name!r}: trigger {job.trigger!r} never fires")
    if not job.distributed:
        return
    shortest: timedelta | None = None
    previous = first
    for _ in range(_SAMPLES):
        following = job.next_fire(previous)
        if following is None:
            break
        gap = following - previous
        shortest = gap if shortest is None else min(shortest, gap)
        previous = following
    if shortest is not None and shortest.total_seconds() <= skew_tolerance:
        raise ConfigurationError(
            f"job {job.name!r}: skew_tolerance {skew_tolerance}s must be shorter than the"
            f" shortest interval between its fire times ({shortest.total_seconds()}s)"
        )


def parse_timeout(value: Duration | None) -> float | None:
    """A job timeout in seconds, or ``None`` for none."""
    return None if value is None else parse_duration(value, what="timeout")


@dataclass(frozen=True)
class RunContext:
    """What a running job may ask about its own run: ``multilock.current_run()``."""

    job: str
    fire_time: datetime
    replica_id: str
    fencing_token: int | None
    """The lease's fencing token (where the backend has one): hand it to the resource."""
    cancel_event: threading.Event = field(repr=False)

    @property
    def cancelled(self) -> bool:
        """Whether the run was asked to stop (timeout, lost lease, shutdown).

        Sync jobs run in worker threads that cannot be interrupted: check this
        (or ``cancel_event.wait(t)``) and return early. Async jobs are cancelled.
        """
        return self.cancel_event.is_set()


_current: contextvars.ContextVar[RunContext] = contextvars.ContextVar("multilock_run")


def current_run() -> RunContext:
    """The :class:`RunContext` of the job running in this task or worker thread."""
    try:
        return _current.get()
    except LookupError:
        raise RuntimeError("current_run() called outside a job run by a Scheduler") from None


def start_run(job: Job, run: RunContext) -> asyncio.Future[Any]:
    """Start ``job`` with ``run`` as its context: a task, or a worker thread for sync jobs."""
    context = contextvars.copy_context()
    context.run(_current.set, run)
    loop = asyncio.get_running_loop()
    if job.is_async:
        return loop.create_task(job.func(*job.args, **job.kwargs), context=context)
    call = functools.partial(context.run, job.func, *job.args, **job.kwargs)
    return loop.run_in_executor(None, call)
