"""APScheduler 3: each scheduled fire time of a job runs on one replica.

Every replica runs the same APScheduler jobs; give them the
:class:`LockedThreadPoolExecutor` instead of APScheduler's thread pool::

    from apscheduler.schedulers.background import BackgroundScheduler
    from multilock.integrations.apscheduler import LockedThreadPoolExecutor

    scheduler = BackgroundScheduler(
        executors={"default": LockedThreadPoolExecutor("postgresql://app@db/app", hold="30s")}
    )
    scheduler.add_job(reindex, "cron", hour=3, id="nightly-reindex")

Each run time (APScheduler's ``scheduled_fire_time``) is a tick: the replica that takes
the lock named after the job's ``id`` runs it and keeps the lock until ``hold`` after
the fire time; the others skip that run time without an event. Give every job an
``id``: APScheduler's default one is random in each process.
"""

from __future__ import annotations

import logging
import re
from contextvars import ContextVar
from datetime import datetime
from typing import Any

from .._durations import Duration
from .._locks.holds import hold as hold_lock
from .._locks.registry import connect
from .._scheduling.per_tick import may_run, shown_tick
from .._scheduling.ticks import check_hold
from ..abc import DistributedLock
from ..errors import BackendUnavailable, ConfigurationError

try:
    from apscheduler.executors.base import run_job
    from apscheduler.executors.pool import ThreadPoolExecutor
    from apscheduler.job import Job
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError(
        "multilock.integrations.apscheduler needs APScheduler 3:"
        " pip install 'multilock[apscheduler]'"
    ) from exc

__all__ = ["LockedThreadPoolExecutor", "current_fire_time"]

log = logging.getLogger("multilock.once")
_GENERATED_ID = re.compile(r"[0-9a-f]{32}")  # uuid4().hex: APScheduler's default job id
_fire_time: ContextVar[datetime | None] = ContextVar("multilock_apscheduler_fire", default=None)


def current_fire_time() -> datetime | None:
    """In a job run by :class:`LockedThreadPoolExecutor`: the fire time it runs for
    (APScheduler's ``scheduled_fire_time``); elsewhere ``None``."""
    return _fire_time.get()


class LockedThreadPoolExecutor(ThreadPoolExecutor):  # type: ignore[misc]
    """APScheduler's thread pool executor, running each fire time of a job once across
    the replicas that share ``lock``.

    ``lock`` is a lock URL (connected here, closed at shutdown) or a sync locker from
    ``multilock.connect`` (left open). The lock name is the job's ``id``; the replica
    that takes it keeps it until ``hold`` has passed since the fire time, so that a
    replica whose clock is late skips that fire time. A replica that takes the lock only
    after ``fire time + hold - 2 x skew_tolerance`` by its own clock skips too. ``hold``
    must be longer than twice ``skew_tolerance``, and ``hold + 2 x skew_tolerance`` at
    most the job's interval (else its next fire time's earliest replica finds the lock
    still held and skips).
    ``max_workers`` and ``pool_kwargs`` are APScheduler's.
    """

    def __init__(
        self,
        lock: str | DistributedLock,
        *,
        hold: Duration,
        skew_tolerance: Duration = 0.25,
        max_workers: int = 10,
        pool_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.hold, self.skew_tolerance = check_hold(hold, skew_tolerance)
        self._owned = isinstance(lock, str)
        self.locker: DistributedLock = connect(lock) if isinstance(lock, str) else lock
        super().__init__(max_workers, pool_kwargs)

    def _do_submit_job(self, job: Job, run_times: list[datetime]) -> None:
        if _GENERATED_ID.fullmatch(job.id):
            raise ConfigurationError(
                f"job {job.name!r} has APScheduler's generated id {job.id!r}, different on"
                " each replica: give it an id (add_job(..., id='nightly-reindex')),"
                " which is its lock name"
            )

        def settled(future: Any) -> None:
            error = future.exception()
            if error is not None:
                self._run_job_error(job.id, error, error.__traceback__)
            else:
                self._run_job_success(job.id, future.result())

        self._pool.submit(self._run_once, job, run_times).add_done_callback(settled)

    def _run_once(self, job: Job, run_times: list[datetime]) -> list[Any]:
        """APScheduler's ``run_job`` for each run time this replica holds in time."""
        events: list[Any] = []
        for run_time in run_times:
            tick = run_time.timestamp()
            try:
                with hold_lock(self.locker, job.id, at_least=self.hold, since=run_time) as lease:
                    if may_run(job.id, lease is not None, tick, self.hold, self.skew_tolerance):
                        events += self._run_at(job, run_time)
            except BackendUnavailable as exc:  # run_job keeps the job's own errors
                log.warning("%s: fire time %s missed: %s", job.id, shown_tick(tick), exc)
        return events

    def _run_at(self, job: Job, run_time: datetime) -> list[Any]:
        token = _fire_time.set(run_time)
        try:
            return list(run_job(job, job._jobstore_alias, [run_time], self._logger.name))
        finally:
            _fire_time.reset(token)

    def shutdown(self, wait: bool = True) -> None:
        """Shut the pool down; close the locker if it was made from a URL."""
        super().shutdown(wait)
        if self._owned:
            self.locker.close()
