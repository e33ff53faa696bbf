"""A registered job, its validation, and the context a running job can read."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import itertools
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal, TypedDict
from zoneinfo import ZoneInfo

from .._durations import Duration, parse_duration
from ..errors import ConfigurationError
from .triggers import CronTrigger, Trigger
from .walltime import as_timezone

__all__ = ["Job", "JobDefaults", "JobOptions", "Overlap", "RunContext", "current_run", "make_job"]

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

    @functools.cached_property  # asked on every run; func never changes
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


class JobOptions(TypedDict, total=False):
    """The keyword options of :meth:`Scheduler.add_job` and :meth:`Scheduler.job`."""

    name: str | None
    timeout: Duration | None
    overlap: Overlap
    distributed: bool
    misfire_grace: Duration | None
    coalesce: bool | None
    timezone: str | None
    args: Iterable[Any]
    kwargs: Mapping[str, Any] | None


@dataclass(frozen=True)
class JobDefaults:
    """What a job takes from its scheduler unless its options say otherwise."""

    timezone: ZoneInfo
    misfire_grace: float
    coalesce: bool


def make_job(
    func: Callable[..., Any], trigger: Trigger, options: JobOptions, defaults: JobDefaults
) -> Job:
    """Validate ``options`` and build the :class:`Job`, or raise naming the problem."""
    if not callable(func):
        raise ConfigurationError(f"a job must be callable, not {type(func).__name__}")
    name = options.get("name")
    if name is None:
        name = getattr(func, "__qualname__", None)
        if name is None:
            raise ConfigurationError(f"job {func!r} has no __qualname__: pass name=")
    if not isinstance(name, str) or not name:
        raise ConfigurationError(f"invalid job name {name!r}: must be a non-empty str")
    if not callable(getattr(trigger, "next_fire", None)):
        raise ConfigurationError(
            f"job {name!r}: {trigger!r} is not a trigger (use every(), cron(), daily()...)"
        )
    overlap = options.get("overlap", "reschedule")
    if overlap not in ("reschedule", "wait"):
        raise ConfigurationError(
            f"job {name!r}: invalid overlap {overlap!r} (expected 'reschedule' or 'wait')"
        )
    timezone, grace, coalesce, timeout = (
        options.get(key) for key in ("timezone", "misfire_grace", "coalesce", "timeout")
    )
    job = Job(
        name=name,
        func=func,
        trigger=trigger,
        timezone=defaults.timezone if timezone is None else as_timezone(timezone),
        timeout=None if timeout is None else parse_duration(timeout, what="timeout"),
        overlap=overlap,
        distributed=bool(options.get("distributed", True)),
        misfire_grace=(
            defaults.misfire_grace if grace is None else parse_duration(grace, what="misfire_grace")
        ),
        coalesce=defaults.coalesce if coalesce is None else bool(coalesce),
        args=tuple(options.get("args", ())),
        kwargs=dict(options.get("kwargs") or {}),
    )
    _validate_arguments(job)
    return job


def _validate_arguments(job: Job) -> None:
    """Refuse ``args``/``kwargs`` that the job's function cannot take."""
    try:
        signature = inspect.signature(job.func)
    except (TypeError, ValueError):
        return  # some builtins have no signature: the first run will tell
    try:
        signature.bind(*job.args, **job.kwargs)
    except TypeError as exc:
        raise ConfigurationError(f"job {job.name!r}: arguments do not fit: {exc}") from None


def hold_span(job: Job, skew_tolerance: float) -> float:
    """How long after a tick's fire time its winner keeps the lease (never past the next
    fire time): ``2 x skew_tolerance + misfire_grace``.

    Every replica's clock is within ``skew_tolerance`` of true time, so two clocks differ
    by up to twice that, and a replica may try the lock up to ``misfire_grace`` after the
    fire time by its own clock: the lease must still be held then (docs/scheduler.md).
    """
    return 2 * skew_tolerance + job.misfire_grace


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
    trigger = job.trigger
    if isinstance(trigger, CronTrigger):  # no seed: jobs sharing the expression share this
        if not trigger.seconds and job.timezone.key == "UTC" and 2 * skew_tolerance < 60:
            return  # its fires are distinct whole minutes of UTC: 60 s apart at least
        shortest = _cron_shortest_gap(trigger, job.timezone, first)
    else:
        shortest = _shortest_gap(trigger, job.timezone, job.name, first)
    if shortest is not None and shortest.total_seconds() <= 2 * skew_tolerance:
        raise ConfigurationError(
            f"job {job.name!r}: skew_tolerance {skew_tolerance:g}s lets two replicas' clocks"
            f" differ by {2 * skew_tolerance:g}s, which must be shorter than the shortest"
            f" interval between its fire times ({shortest.total_seconds():g}s)"
        )


def _shortest_gap(trigger: Trigger, tz: ZoneInfo, seed: str, first: datetime) -> timedelta | None:
    """The shortest interval between ``first`` and the ``_SAMPLES`` fire times after it."""
    fires = [first]
    for _ in range(_SAMPLES):
        following = trigger.next_fire(fires[-1], tz, seed)
        if following is None:
            break
        fires.append(following)
    return _shortest(fires)


def _cron_shortest_gap(trigger: CronTrigger, tz: ZoneInfo, first: datetime) -> timedelta | None:
    """:func:`_shortest_gap` of a cron, remembered by the trigger (shared by the jobs of its
    expression) for the last ``(tz, first)`` asked: they are added one after the other."""
    memo = trigger.gap_memo
    if memo is not None and memo[0] == tz and memo[1] == first:
        return memo[2]
    shortest = _shortest([first, *trigger.next_fires(first, tz, _SAMPLES)])
    trigger.gap_memo = (tz, first, shortest)
    return shortest


def _shortest(fires: list[datetime]) -> timedelta | None:
    return min((after - before for before, after in itertools.pairwise(fires)), default=None)


_EVENT_GUARD = threading.Lock()


@dataclass(frozen=True, slots=True)
class RunContext:
    """What a running job may ask about its own run: ``multilock.current_run()``."""

    job: str
    fire_time: datetime
    replica_id: str
    fencing_token: int | None
    """The lease's fencing token (where the backend has one): hand it to the resource."""
    # Made on first use: most runs never need one, and a threading.Event costs more
    # than the rest of a run's context. Set past the frozen dataclass's guard (the
    # only field that changes): a list to hold it would be one more object per run.
    _event: threading.Event | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def cancel_event(self) -> threading.Event:
        """Set when the run is asked to stop; a sync job may ``wait(t)`` on it."""
        event = self._event
        if event is None:
            with _EVENT_GUARD:  # the job's thread and the loop may both ask first
                event = self._event
                if event is None:
                    event = threading.Event()
                    object.__setattr__(self, "_event", event)
        return event

    @property
    def cancelled(self) -> bool:
        """Whether the run was asked to stop (timeout, lost lease, shutdown).

        Sync jobs run in worker threads that cannot be interrupted: check this
        (or ``cancel_event.wait(t)``) and return early. Async jobs are cancelled.
        """
        event = self._event
        return event is not None and event.is_set()


_current: contextvars.ContextVar[RunContext] = contextvars.ContextVar("multilock_run")


def current_run() -> RunContext:
    """The :class:`RunContext` of the job running in this task or worker thread."""
    try:
        return _current.get()
    except LookupError:
        raise RuntimeError("current_run() called outside a job run by a Scheduler") from None


def run_context(run: RunContext) -> contextvars.Context:
    """A copy of the current context in which :func:`current_run` is ``run``: where
    the run's body runs."""
    context = contextvars.copy_context()
    context.run(_current.set, run)
    return context


def run_in(context: contextvars.Context) -> RunContext:
    """The run whose :func:`run_context` ``context`` is."""
    return context[_current]


def start_run(
    job: Job,
    run: RunContext,
    executor: Executor | None = None,
    started: Callable[[], object] | None = None,
    context: contextvars.Context | None = None,
) -> asyncio.Future[Any]:
    """Start ``job`` with ``run`` as its context: a task, or for a sync job a call on
    ``executor``'s worker threads, which calls ``started()`` there as the body starts
    (it may wait for a free thread first) -- unless the run was cancelled meanwhile.
    ``context``: the run's :func:`run_context`, if made already."""
    if context is None:
        context = run_context(run)
    loop = asyncio.get_running_loop()
    if job.is_async:
        # Named after its job: what a dump of the loop's tasks shows, and a task without
        # a name formats one ("Task-N") as it is made.
        body = job.func(*job.args, **job.kwargs)
        return loop.create_task(body, name=job.name, context=context)
    call = functools.partial(context.run, _in_worker, run, started, job)
    return loop.run_in_executor(executor, call)


def _in_worker(run: RunContext, started: Callable[[], object] | None, job: Job) -> Any:
    if run.cancelled:
        return None  # stopped while it waited for a thread: the run reports why
    if started is not None:
        started()
    return job.func(*job.args, **job.kwargs)
