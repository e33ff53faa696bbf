"""The scheduler: fires jobs on triggers, exactly once per tick across replicas."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, TypeVar, Unpack

from .._durations import Duration, parse_duration
from .._locks.base import check_name
from .._locks.file import default_directory
from .._locks.keys import advisory_key
from .._locks.outcome import Outcome, in_task, undo_on_cancel
from .._locks.registry import connect_async
from .._locks.sync_adapter import AsyncView
from .._masking import masked_line
from .._signal import LostSignal
from ..abc import (
    AsyncDistributedLock,
    AsyncLease,
    DistributedLock,
    SupportsAcquireManyStarted,
    SupportsAsyncReleaseMany,
    SupportsReleaseStarted,
)
from ..errors import BackendUnavailable, ClaimsUnavailable, ConfigurationError
from .claims import TickClaims, TickPath, claim_grace
from .clock import Cancellable, Clock, SharedTimers, SystemClock, call_at
from .events import EventKind, JobEvent, Listener, emit, log, wanted
from .jobs import (
    Job,
    JobDefaults,
    JobOptions,
    RunContext,
    hold_span,
    make_job,
    run_context,
    run_in,
    validate_schedule,
)
from .leadership import Campaign, keep_alive, needs_keep_alive
from .metrics import Recorder, metrics_listener
from .queue import FireQueue
from .repeats import Repeats
from .run_states import BODY_STATES, RunLifecycle, RunState
from .runs import Run, RunHost, begin, wait_quietly
from .service import Service
from .triggers import Trigger
from .walltime import as_timezone

__all__ = ["Scheduler"]

FuncT = TypeVar("FuncT", bound=Callable[..., Any])
T = TypeVar("T")
Coordination = Literal["lock", "leader"]
# What ends a run_now() run; not an overlap: that is another call's answer, said at once.
_OUTCOMES = frozenset(EventKind) - {EventKind.STARTED, EventKind.SKIPPED_OVERLAP}
_MAX_CATCH_UP = 1000  # ticks walked one by one after a pause; beyond, they are skipped in bulk
_HOLD_GRID = 20  # lease holds end on 1/20 s boundaries (rounded up): see _hold_until
PROBE_NAME = "multilock-probe"
"""The lock name the scheduler's backend probe tries (a lease, or "held elsewhere": both
are answers); taken and released at once."""
_PROBE_TIMEOUT = 10.0  # seconds a probe may wait for its answer (real time)
_BACKOFF_FIRST, _BACKOFF_MAX = 0.5, 10.0  # the pauses of wait_for_backend, doubling
_HOLDING, _STARTED = RunState.HOLDING, EventKind.STARTED  # read per run: see runs.py
# A burst: at least this many jobs due at one instant are prepared ahead of it (their
# ticks claimed, their locks taken), _LEAD_PER_JOB seconds each plus the backend's
# answer time, at most _MAX_LEAD; their bodies start at the instant (see _arm).
_BURST = 50
_LEAD_PER_JOB = 20e-6
_MAX_LEAD = 0.5
_LEAD_GRID = 0.005


@dataclass(slots=True)
class _JobState:
    """Where a job is in this process. Changed only on the loop, synchronously.

    One reference says it all: ``current``, the tick this process has claimed for the
    job, from the claim until its run is over and its lease given back. Whether the job
    runs, is busy or holds a lease is read off that tick's :class:`RunState` (its
    lifecycle is the one owner), never set beside it.
    """

    job: Job
    next_fire: datetime | None = None
    # ``next_fire`` in seconds since the epoch (infinity for none): what the queue and
    # the due check compare, computed once per fire time. Set both with advance().
    next_at: float = math.inf
    current: _Tick | None = None  # claimed, not yet settled: the job is busy
    # The last fire popped, whose next is ``next_fire``: saves a call. A fire alone, not
    # the pair: a tuple per run would be one more object for the garbage collector.
    successor: datetime | None = None
    # See changed(). None while nobody waits: a run notifies two or three times, and a
    # fresh empty list each time was a new object for the garbage collector per notify.
    waiters: list[asyncio.Future[None]] | None = None
    # Ticks of the job waiting for the previous run (``overlap="wait"``): a tick due
    # meanwhile queues behind them, so that the job's ticks run in fire order (one
    # taking the hold of a later tick's run would end that hold early).
    waiting: int = 0

    def advance(self, fire: datetime | None) -> None:
        """The job's next fire time is ``fire`` (``None``: it fires no more)."""
        self.next_fire = fire
        self.next_at = math.inf if fire is None else fire.timestamp()

    def claim(self, tick: _Tick) -> None:
        """``tick`` will run, so that no other tick claims the job meanwhile."""
        self.current = tick

    def notify(self) -> None:
        """Wake whoever waits for this job's state to change."""
        waiters = self.waiters
        if waiters is None:
            return
        self.waiters = None
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def changed(self) -> asyncio.Future[None]:
        """A future done at the next :meth:`notify` (made only for who waits: most
        notifies have no waiter)."""
        waiter = asyncio.get_running_loop().create_future()
        if self.waiters is None:
            self.waiters = [waiter]
        else:
            self.waiters.append(waiter)
        return waiter

    def settle(self, tick: _Tick | None = None) -> None:
        """``tick``'s run is over and its lease released: the job is free (unless a
        newer tick is current). Without ``tick``: whatever the job had (a start)."""
        if tick is None or self.current is tick:
            self.current = None
        self.notify()

    @property
    def running(self) -> bool:
        """A body is still to come or runs (what ``overlap`` is about)."""
        current = self.current
        return current is not None and current.state in BODY_STATES

    @property
    def holding(self) -> AsyncLease | None:
        """The lease the current tick's run holds after its body (``None`` unless that
        run is in its hold)."""
        current = self.current
        if current is None or current.state is not _HOLDING or current.run is None:
            return None
        return current.run.lease

    def take_hold(self, tick: _Tick) -> AsyncLease | None:
        """The lease a finished run still holds, handed to ``tick``, which becomes the
        current one (or ``None``: nothing to take over)."""
        holder = self.current
        if holder is None or holder.state is not _HOLDING or holder.run is None:
            return None
        run = holder.run
        lease = run.lease
        if lease is None or not lease.held:
            return None
        self.current = tick
        run.handed_over()  # its hold ends, and it leaves the lease be
        self.notify()
        return lease

    @property
    def ready(self) -> bool:
        """No tick claimed, or only one in its hold whose lease the next may take over."""
        current = self.current
        if current is None:
            return True
        if current.state is not _HOLDING or current.run is None:
            return False
        lease = current.run.lease
        return lease is not None and lease.held


_Tick = RunLifecycle["_JobState"]
"""One tick of one job, and its run's life."""
_Start = tuple[_Tick, AsyncLease | None, LostSignal | None, int | None]
"""A run to start: the tick, its lease, the signal that cancels it, the fencing token."""
_Made = list[contextvars.Context]
"""The contexts that runs prepared ahead will run in, each with its run context set."""


class Scheduler(Service):
    """Runs jobs on triggers; a distributed job runs once per tick across all replicas.

    ``lock`` is a lock URL, a locker (``multilock.connect_async(...)``, or a
    sync one from ``multilock.connect(...)``, used from a worker thread), or
    ``None`` for ``file://`` in a per-user directory (replicas on one host).
    A locker given is not closed by the scheduler.
    ``timezone`` (default UTC, never the host's) reads calendar triggers.
    ``skew_tolerance`` (default 250 ms): how far any replica's clock may be from
    true time; a tick's winner keeps its lease until ``2 x skew_tolerance +
    misfire_grace`` after the fire time (never past the next one), so that a
    replica firing late skips it; twice the tolerance must be shorter than every
    distributed job's interval.
    ``misfire_grace`` (default ``skew_tolerance``): how late a tick may still
    run. ``coordination="leader"`` runs distributed jobs on one elected replica
    instead of taking a lock per job. ``lease_ttl``: the ttl
    margin of leases on TTL backends. ``stop_timeout``: how long shutdown waits
    for running jobs. ``clock`` drives every time decision (tests inject one).
    ``metrics`` records Prometheus metrics into ``registry`` when
    prometheus-client is installed.
    ``wait_for_backend`` (default ``None``): how long :meth:`start` retries a
    backend that does not answer its probe, with backoff, before it gives up; by
    default it refuses to start at once (``BackendUnavailable``). ``probe_interval``
    (default 10 s, ``None`` for never): how often the backend is probed while
    running, for :meth:`readiness` and to report an outage before the next tick.
    ``max_workers`` (default 32): the threads of the pool that runs sync jobs; a run
    that must wait for a free one is logged and counted.
    ``tick_claims`` (default ``True``): on a backend that claims ticks
    (``Capability.TICK_CLAIM``), claim each tick instead of holding its lock past it:
    exactly once whatever the clocks say (``False``: hold, as on other backends --
    every replica of a fleet must do the same).
    See ``docs/scheduler.md`` for the exactly-once guarantee and its limits.
    """

    def __init__(
        self,
        lock: str | AsyncDistributedLock | DistributedLock | None = None,
        *,
        timezone: str = "UTC",
        skew_tolerance: Duration = 0.25,
        misfire_grace: Duration | None = None,
        coalesce: bool = True,
        stop_timeout: Duration = 30.0,
        coordination: Coordination = "lock",
        leader_name: str = "multilock-scheduler-leader",
        leader_poll: Duration = 1.0,
        lease_ttl: Duration = 10.0,
        replica_id: str | None = None,
        clock: Clock | None = None,
        metrics: bool = True,
        registry: Any = None,
        wait_for_backend: Duration | None = None,
        probe_interval: Duration | None = 10.0,
        max_workers: int = 32,
        tick_claims: bool = True,
    ) -> None:
        if lock is None:
            lock = "file://" + str(default_directory())
        self._source = lock
        self.tick_claims = bool(tick_claims)
        self._use(self._make_locker())
        if coordination not in ("lock", "leader"):
            raise ConfigurationError(
                f"invalid coordination {coordination!r} (expected 'lock' or 'leader')"
            )
        self.timezone = as_timezone(timezone)
        self.skew_tolerance = parse_duration(skew_tolerance, what="skew_tolerance")
        self.misfire_grace = (
            self.skew_tolerance
            if misfire_grace is None
            else parse_duration(misfire_grace, what="misfire_grace")
        )
        self.coalesce = coalesce
        self._defaults = JobDefaults(self.timezone, self.misfire_grace, self.coalesce)
        self.stop_timeout = parse_duration(stop_timeout, what="stop_timeout")
        self.coordination: Coordination = coordination
        self.lease_ttl = parse_duration(lease_ttl, what="lease_ttl")
        self.replica_id = replica_id or f"{socket.gethostname()}-{os.getpid()}"
        self.clock: Clock = clock or SystemClock()
        self.wait_for_backend = (
            0.0
            if wait_for_backend is None
            else parse_duration(wait_for_backend, what="wait_for_backend")
        )
        self.probe_interval = (
            None
            if probe_interval is None
            else parse_duration(probe_interval, what="probe_interval")
        )
        if self.probe_interval == 0:
            raise ConfigurationError("probe_interval must be positive (or None: never)")
        if isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1:
            raise ConfigurationError(f"max_workers must be a positive int, not {max_workers!r}")
        self.max_workers = max_workers
        self._listeners: list[Listener] = []
        self._manual: set[asyncio.Future[EventKind]] = set()  # run_now() calls waiting
        self._recorder: Recorder | None = metrics_listener(registry) if metrics else None
        if self._recorder is not None:
            self._listeners.append(self._recorder)
        self._outage = Repeats(log, self.clock)  # the backend not answering
        self._crowded = Repeats(log, self.clock)  # sync jobs waiting for a worker thread
        self._reachable: tuple[bool, str] = (False, "the scheduler has not started")
        self._pool: ThreadPoolExecutor | None = None  # runs sync jobs, made on first use
        self._workers_busy = 0  # sync runs submitted and not over (started or queued)
        self._probes: set[asyncio.Task[str | None]] = set()
        self._states: dict[str, _JobState] = {}  # the loop reads snapshots: list(values())
        self._guard = threading.Lock()
        self._keys: dict[int, str] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runs: set[asyncio.Task[None]] = set()  # tasks: waits for a previous run, releases
        self._active: set[Run] = set()  # runs not over (body, hold or release)
        self._held: set[AsyncLease] = set()  # released at stop even if a run never started
        self._releasing: list[tuple[AsyncLease, Callable[[], object]]] = []
        self._flushing = False
        self._quiet: asyncio.Future[None] | None = None  # stop() waits on it
        self._timers: SharedTimers[Run] | None = None  # made on the loop, for its clock
        self._run_host = RunHost(
            self.clock,
            self._emit,
            self._hold_until,
            self._hold_timers,
            self._release_later,
            self._run_finished,
            contextvars.Context(),  # replaced by start()'s: no run exists before it
        )
        self._tasks: list[asyncio.Task[None]] = []
        self._queue: FireQueue[_JobState] = FireQueue()  # the loop's: by next fire time
        # Its timer, and when it is due: two fields, not a pair, and a callback bound
        # once, so a wake makes no object but the loop's timer handle.
        self._timer: Cancellable | None = None
        self._timer_due: float | None = None
        self._timer_wake = math.inf  # _timer_due, or earlier: see _arm
        self._wake = self._on_timer
        # The last burst prepared ahead: the jobs still due then fire on time, not ahead.
        self._prepared_until = -math.inf
        # How long the backend took to answer a tick's claims and locks (moving averages,
        # seconds): a burst is prepared that much earlier.
        self._claim_wait = self._lock_wait = 0.0
        self._stopping = False
        self._leadership = (
            Campaign(
                self._locker,
                leader_name,
                ttl=self.lease_ttl,
                poll=parse_duration(leader_poll, what="leader_poll"),
                clock=self.clock,
                replica_id=self.replica_id,
                answered=self._answered,
                unanswered=self._unanswered,
            )
            if coordination == "leader"
            else None
        )

    # --- registration ---------------------------------------------------------------

    def job(self, trigger: Trigger, **options: Unpack[JobOptions]) -> Callable[[FuncT], FuncT]:
        """Decorator form of :meth:`add_job` (same options); returns the function unchanged."""

        def register(func: FuncT) -> FuncT:
            self.add_job(func, trigger, **options)
            return func

        return register

    def add_job(
        self, func: Callable[..., Any], trigger: Trigger, **options: Unpack[JobOptions]
    ) -> Job:
        """Register ``func`` to run on ``trigger``; every problem is reported here.

        Options: ``name`` is the lock name (default: the function's qualified
        name). ``timeout`` cancels the run (a sync job sees
        ``current_run().cancelled``). ``overlap``: when the previous run in this
        process is still going, ``"reschedule"`` skips the tick and ``"wait"``
        runs it after, if still within ``misfire_grace``. ``distributed=False``
        runs on every replica. ``coalesce`` and ``timezone`` override the
        scheduler's. ``args``/``kwargs`` are bound now and passed to every run.
        """
        job = make_job(func, trigger, options, self._defaults)
        check_name(job.name)  # before hashing it: a name may be any length until here
        validate_schedule(job, self._now(), self.skew_tolerance)
        key = advisory_key(job.name)
        state = _JobState(job)
        with self._guard:  # add_job may be called from any thread
            if job.name in self._states:
                raise ConfigurationError(f"a job named {job.name!r} is already registered")
            if key in self._keys:
                raise ConfigurationError(
                    f"job names {job.name!r} and {self._keys[key]!r} have the same advisory"
                    f" key {key}: rename one"
                )
            self._keys[key] = job.name
            self._states[job.name] = state
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._install, state)
        return job

    def remove_job(self, name: str) -> None:
        """Stop scheduling ``name`` (a run in progress finishes)."""
        with self._guard:
            state = self._states.pop(name, None)
            if state is None:
                raise KeyError(f"no job named {name!r}")
            self._keys.pop(advisory_key(name), None)

    @property
    def jobs(self) -> list[Job]:
        """The registered jobs."""
        return [state.job for state in list(self._states.values())]

    async def run_now(self, name: str) -> EventKind:
        """Run job ``name`` once now, outside its schedule, as one of its ticks would run:
        under its lock (or the leadership, in leader mode), so that a replica holding
        the job skips it; return the outcome (``SUCCEEDED``, ``FAILED``, ``TIMED_OUT``,
        ``LEASE_LOST``, ``SKIPPED_HELD``...) once the run has ended.

        The run's ``fire_time`` is the moment of the call, by the scheduler's clock; it
        holds the job's lease for the usual hold after that moment. A run of the job
        still going in this process: ``SKIPPED_OVERLAP`` at once. The scheduler must be
        running; raises ``KeyError`` for a job it does not have, and ``RuntimeError``
        when the scheduler stops before the run has ended.
        """
        state = self._states.get(name)
        if state is None:
            raise KeyError(f"no job named {name!r}")
        if self._loop is None or self._stopping:
            raise RuntimeError("run_now() needs a running scheduler (start() it first)")
        fire = self._now()
        if not state.ready:
            self._emit(EventKind.SKIPPED_OVERLAP, state.job, fire, reason="run_now: still running")
            return EventKind.SKIPPED_OVERLAP
        ended: asyncio.Future[EventKind] = asyncio.get_running_loop().create_future()

        def outcome(event: JobEvent) -> None:
            mine = event.job == name and event.fire_time == fire
            if mine and event.kind in _OUTCOMES and not ended.done():
                ended.set_result(event.kind)

        self._listeners.append(outcome)
        self._manual.add(ended)
        try:
            due = RunLifecycle(state.job, fire, state)
            if not self._continue_hold(due):  # still holding the last tick's lease: under it
                state.claim(due)
                self._start_batch([due])
            return await ended
        finally:
            self._listeners.remove(outcome)
            self._manual.discard(ended)

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener(event)`` with every :class:`~multilock.JobEvent`."""
        self._listeners.append(listener)

    def tick_path(self, job: Job) -> TickPath | Literal["leader", "local"]:
        """How ``job``'s ticks are made to run once across replicas: ``"claim"`` (the
        backend claims each tick: see :mod:`multilock._scheduling.claims`), ``"hold"``
        (the lock is held past each tick), ``"leader"``, or ``"local"`` (not distributed)."""
        if not job.distributed:
            return "local"
        return "leader" if self._leadership is not None else self._claims.path

    @property
    def is_leader(self) -> bool:
        """In leader mode, whether this replica currently leads."""
        return self._leadership is not None and self._leadership.held

    # --- lifecycle ----------------------------------------------------------------

    async def start(self) -> None:
        """Probe the backend, then start firing jobs on the running event loop.

        Raises :class:`~multilock.errors.BackendUnavailable` (one line: why) when the
        backend does not answer, at once or, with ``wait_for_backend``, once that has
        passed; each failed attempt is logged once.
        """
        if self._loop is not None:
            raise RuntimeError("this Scheduler is already running")
        self._loop = asyncio.get_running_loop()
        self._stopping = False
        # The runs' callbacks run in the context the scheduler was started in.
        self._run_host = replace(self._run_host, context=contextvars.copy_context())
        try:
            await self._await_backend()
        except BaseException:
            for probe in list(self._probes):  # one still waiting: nobody will read it
                probe.cancel()
                await wait_quietly(probe)
            self._loop = None
            await self._reset_locker()
            raise
        if self._stopping:  # stop() came while the backend was probed: it tears down
            return
        self._queue.clear()
        for state in list(self._states.values()):
            self._install(state)
        if self._leadership is not None:
            leading = self._leadership.run()
            self._tasks.append(asyncio.create_task(leading, name="multilock-leader"))
        if self.probe_interval is not None:
            probing = self._probe_periodically(self.clock.now(), self.probe_interval)
            self._tasks.append(asyncio.create_task(probing, name="multilock-probe"))
        log.info(
            "scheduler started: %d jobs, replica %s, lock %s, coordination %s, ticks %s",
            len(self._states),
            self.replica_id,
            self._locker.url,
            self.coordination,
            "led" if self._leadership is not None else self._claims.path,
            extra={"replica_id": self.replica_id},
        )

    async def stop(self) -> None:
        """Stop: no new runs; wait up to ``stop_timeout`` for running ones (their lease
        holds included), cancel the rest, release every lease."""
        if self._loop is None:
            return
        self._stopping = True
        self._disarm()
        for task in list(self._probes):
            task.cancel()
        for task in list(self._probes):
            await wait_quietly(task)
        # A leader's task renews the leader lease its runs run under: it is stopped only
        # once they are over (on a TTL backend that does not renew, the lease would expire
        # under them). A follower stops competing at once.
        if not self.is_leader:
            await self._cancel_tasks()
        if self._active or self._runs:
            self._quiet = asyncio.get_running_loop().create_future()
            await asyncio.wait({self._quiet}, timeout=self.stop_timeout)
            self._quiet = None
        await self._cancel_tasks()
        for run in list(self._active):
            run.abort()  # its lease is still in _held: released below
        self._timers = None  # its pending timers die with this loop
        for task in list(self._runs):
            task.cancel()
        for task in list(self._runs):
            await wait_quietly(task)
        for lease in list(self._held):
            await self._release(lease)
        if self._leadership is not None:
            await self._leadership.release()
        if self._pool is not None:  # a stuck sync job's thread is abandoned (warned above)
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool, self._workers_busy = None, 0
        await self._reset_locker()
        for ended in self._manual:  # abandoned by the stop: no outcome will come
            if not ended.done():
                ended.set_exception(RuntimeError("the scheduler stopped before the run ended"))
        self._loop = None
        self._reachable = (False, "the scheduler has stopped")
        log.info("scheduler stopped", extra={"replica_id": self.replica_id})

    async def _reset_locker(self) -> None:
        if self._locker is not self._source:  # made here: ours to close
            await self._locker.aclose()
            self._use(self._make_locker())  # connects lazily, if started again
            if self._leadership is not None:
                self._leadership.locker = self._locker

    # --- the backend's health -----------------------------------------------------------

    def readiness(self) -> tuple[bool, str]:
        """``(True, "ready")`` when the scheduler runs and its backend answered the last
        probe (or lock round trip); else ``False`` and why. Safe from any thread."""
        if self._loop is None:
            return False, "the scheduler is not running"
        return self._reachable

    def liveness(self, timeout: float = 1.0) -> tuple[bool, str]:
        """``(True, "alive")`` when the scheduler runs and its event loop runs a callback
        within ``timeout`` seconds; else ``False`` and why. Call it from another thread
        (an HTTP server's): on the loop's own thread it answers at once."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return False, "the scheduler is not running"
        try:
            if asyncio.get_running_loop() is loop:
                return True, "alive"
        except RuntimeError:
            pass  # not on a loop: the usual case
        answered = threading.Event()
        try:
            loop.call_soon_threadsafe(answered.set)
        except RuntimeError:  # closed meanwhile
            return False, "the scheduler is not running"
        if not answered.wait(timeout):
            return False, f"the scheduler's event loop did not answer within {timeout:g}s"
        return True, "alive"

    async def _await_backend(self) -> None:
        """Probe until the backend answers; give up (raise) once ``wait_for_backend`` is
        spent, logging each failed attempt once."""
        began = self.clock.now()
        pause, attempt = _BACKOFF_FIRST, 0
        while True:
            attempt += 1
            problem = await self._probe()
            if self._stopping:
                return
            if problem is None:
                if attempt > 1:
                    log.info("backend answered at attempt %d", attempt)
                return
            waited = self.clock.now() - began
            left = self.wait_for_backend - waited
            if left <= 0:
                after = f" after {attempt} attempts in {waited:.1f}s" if attempt > 1 else ""
                raise BackendUnavailable(f"the scheduler cannot start{after}: {problem}")
            pause = min(pause, left)
            log.warning(
                "backend unreachable at start (attempt %d, next in %.1fs, %.1fs left): %s",
                attempt,
                pause,
                left,
                problem,
            )
            await self.clock.sleep_until(self.clock.now() + pause)
            pause = min(pause * 2, _BACKOFF_MAX)

    async def _probe_periodically(self, since: float, interval: float) -> None:
        next_probe = since + interval
        while True:
            await self.clock.sleep_until(next_probe)
            next_probe = max(next_probe + interval, self.clock.now())
            problem = await self._probe()
            if self._stopping:
                return  # a probe cut short by stop() says nothing of the backend
            if problem is not None and self._unanswered(problem, "probes failed"):
                log.warning("backend unreachable: %s", problem)

    async def _probe(self) -> str | None:
        """Ask the backend for the probe lock: ``None`` when it answered (a lease, at
        once released, or "held elsewhere"), else why not. A probe still waiting after
        ``_PROBE_TIMEOUT`` is left to finish (and release) on its own, and no other
        starts while it waits."""
        if self._probes:
            return f"{self._locker.url}: still no answer to the previous probe"
        probe = asyncio.ensure_future(self._ask_backend())
        self._probes.add(probe)
        probe.add_done_callback(self._probes.discard)
        done, _ = await asyncio.wait({probe}, timeout=_PROBE_TIMEOUT)
        if not done:
            return f"{self._locker.url}: no answer within {_PROBE_TIMEOUT:g}s"
        if probe.cancelled():  # by stop()
            return "the scheduler is stopping"
        problem = probe.result()
        if problem is None:
            self._answered()
        return problem

    async def _ask_backend(self) -> str | None:
        try:
            lease = await self._locker.try_acquire(PROBE_NAME, ttl=self.lease_ttl)
            if lease is not None:
                await lease.release()
        except Exception as exc:
            if isinstance(exc, BackendUnavailable):
                return masked_line(exc)
            return masked_line(f"{self._locker.url}: {type(exc).__name__}: {exc}")
        return None

    def _answered(self) -> None:
        """The backend answered (a probe, or a lock round trip)."""
        self._reachable = (True, "ready")
        if self._outage.current is not None:
            self._outage.clear("backend reachable again")

    def _unanswered(self, problem: str, what: str) -> bool:
        """The backend did not answer (``problem``): ``True`` if this is the first report
        of it (to be logged), else it is counted as one more ``what``."""
        self._reachable = (False, f"backend unreachable: {problem}")
        return self._outage.report(problem, what)

    async def _cancel_tasks(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            await wait_quietly(task)
        self._tasks.clear()

    def use_lock(self, lock: str | AsyncDistributedLock | DistributedLock) -> None:
        """Replace the lock (a URL or a locker) before the scheduler starts.

        What ``multilock run --lock URL`` calls on the scheduler the user's module
        built, so that one module runs on any backend without editing it.
        """
        if self._loop is not None:
            raise RuntimeError("use_lock() must be called before the scheduler starts")
        self._source = lock
        self._use(self._make_locker())
        if self._leadership is not None:
            self._leadership.locker = self._locker

    def _use(self, locker: AsyncDistributedLock) -> None:
        """Make ``locker`` the scheduler's, with the optional fast paths it offers
        (:mod:`multilock.abc`), looked up once here rather than at every tick."""
        self._locker = locker
        self._start_acquire = (
            locker.try_acquire_many_started
            if isinstance(locker, SupportsAcquireManyStarted)
            else None
        )
        self._release_many = (
            locker.release_many if isinstance(locker, SupportsAsyncReleaseMany) else None
        )
        self._claims = TickClaims(locker, self.tick_claims)
        self._keep_alive = needs_keep_alive(locker)

    def _make_locker(self) -> AsyncDistributedLock:
        source = self._source
        if isinstance(source, str):
            return connect_async(source)
        acquire = getattr(source, "try_acquire_many", None)
        if inspect.iscoroutinefunction(acquire):
            return source  # type: ignore[return-value]
        if callable(acquire):
            return AsyncView(source)  # type: ignore[arg-type]
        raise ConfigurationError(
            f"Scheduler(lock=...) takes a URL or a locker (multilock.connect_async(url) or"
            f" multilock.connect(url)), not {type(source).__name__}"
        )

    def __repr__(self) -> str:
        return (
            f"<Scheduler {self._locker.url} jobs={len(self._states)}"
            f" coordination={self.coordination} replica={self.replica_id!r}>"
        )

    # --- the loop -------------------------------------------------------------------

    def _now(self) -> datetime:
        return datetime.fromtimestamp(self.clock.now(), UTC)

    def _install(self, state: _JobState) -> None:
        # A tick that fired just before we started may still be ours to run, if no
        # replica took it; earlier ones are not this replica's to report as missed.
        lookback = min(state.job.misfire_grace, self.skew_tolerance)
        since = self._now() - timedelta(seconds=lookback)
        state.advance(state.job.next_fire(since))
        state.successor = None
        self._enqueue(state)
        state.settle()
        self._arm()

    def _enqueue(self, state: _JobState) -> None:
        if state.next_fire is None:
            self._queue.discard(state.job.name)
        else:
            self._queue.put(state.job.name, state.next_at, state)

    # The scheduler is driven by one loop timer, armed for the earliest queued job, whose
    # callback starts what is due: no task wakes up for it, so a job costs no loop turns
    # of the scheduler's own (with a thousand jobs spread over the second, a thousand a
    # second). Only a lock round trip that cannot be answered at once gets a task.

    def _arm(self) -> None:
        """Arm the timer for the earliest queued job (if not armed for it already).

        A burst (``_BURST`` jobs or more due at one instant) wakes the scheduler ahead
        of its instant, by :meth:`_lead`: its ticks are claimed, its locks taken and
        its runs made by then, and the bodies start at the instant (never before it).
        Without it the last body of a thousand due at once would wait for every
        other job's bookkeeping, and for the backend's answer.
        """
        deadline = None if self._stopping else self._queue.earliest()
        if deadline is None:
            self._disarm()
            return
        wake = deadline
        if deadline > self._prepared_until:
            count = self._queue.count_at(deadline)
            if count >= _BURST:
                wake = deadline - self._lead(count)
        if self._timer is not None and self._timer_due == deadline and self._timer_wake <= wake:
            return  # armed for it, early enough
        self._disarm()
        self._timer_due, self._timer_wake = deadline, wake
        self._timer = call_at(self.clock, wake, self._wake, self._run_host.context)

    def _lead(self, count: int) -> float:
        """How long before ``count`` jobs due at one instant the scheduler prepares them."""
        lead = count * _LEAD_PER_JOB + self._claim_wait + self._lock_wait
        # On a grid: jobs added one by one re-arm the timer once a step, not once a job.
        return min(_MAX_LEAD, math.ceil(lead / _LEAD_GRID) * _LEAD_GRID)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _on_timer(self) -> None:
        self._timer = None
        try:
            if not self._stopping:
                self._fire_due()
        except Exception:  # never leave the timer unarmed: the scheduler would stop
            log.exception("scheduler bug while starting due jobs")
        finally:
            self._arm()

    def _fire_due(self) -> None:
        now = self.clock.now()
        horizon = self._timer_due
        if horizon is None or horizon <= now:
            horizon = now
        else:  # woken ahead of a burst: see _arm
            self._prepared_until = horizon
        batch: list[_Tick] = []
        held: list[_Start] = []  # ticks run under the lease their previous tick holds
        for state in self._queue.pop_due(horizon):
            job = state.job
            if self._states.get(job.name) is not state:
                continue  # removed since it was queued
            first_at = state.next_at
            if first_at > now and (not state.ready or state.waiting):
                # Busy now, maybe not at its fire time: decided then (on time, not ahead).
                self._queue.put(job.name, first_at, state)
                continue
            fires = self._pop_due(state, horizon)
            self._enqueue(state)
            if not fires:
                continue
            if (
                len(fires) == 1
                and state.ready
                and not state.waiting
                and now - first_at <= job.misfire_grace
            ):
                # The common case, without the lists below: one tick, on time, job idle.
                due = RunLifecycle(job, fires[0], state, first_at)
                if not self._continue_hold(due, held):
                    state.claim(due)
                    batch.append(due)
                continue
            grace = self._grace(job, fires[-1], state.next_fire)
            if state.holding is not None and state.holding.held:
                # Still holding the job's lease from the previous tick: no other replica
                # can have run these, so lateness up to the tolerance cannot duplicate.
                grace = max(grace, self.skew_tolerance)
            fresh = [f for f in fires if now - f.timestamp() <= grace]
            for fire in fires[: len(fires) - len(fresh)]:  # the late ones come first
                late = now - fire.timestamp()
                self._miss(RunLifecycle(job, fire, state), f"{late:.3f}s late")
            if job.coalesce and len(fresh) > 1 and not self._claiming(job):
                for fire in fresh[:-1]:
                    self._miss(RunLifecycle(job, fire, state), "coalesced")
                fresh = fresh[-1:]
            for i, fire in enumerate(fresh):
                due = RunLifecycle(job, fire, state)
                if state.running and i == 0 and job.overlap == "reschedule":
                    due.skip()
                    self._emit(EventKind.SKIPPED_OVERLAP, job, fire, reason="still running")
                elif i > 0 or not state.ready or state.waiting:
                    self._spawn(self._after_previous(due))
                elif not self._continue_hold(due, held):
                    state.claim(due)  # now: the run starts on a later loop turn
                    batch.append(due)
        self._launch(held)
        if batch:
            self._start_batch(batch)

    def _continue_hold(self, due: _Tick, into: list[_Start] | None = None) -> bool:
        """If this replica still holds the job's lease from the previous tick, run this
        tick under it: nobody else can have run it, and no release/acquire can race.
        Started now, or added to ``into`` to be started with the other ticks due."""
        lease = due.job_state.take_hold(due)
        if lease is None:
            return False
        start = (due, lease, lease.lost, lease.fencing_token)
        if into is None:
            self._launch([start])
        else:
            into.append(start)
        return True

    def _pop_due(self, state: _JobState, now: float) -> list[datetime]:
        fires: list[datetime] = []
        while state.next_fire is not None and state.next_at <= now:
            fires.append(state.next_fire)
            if len(fires) >= _MAX_CATCH_UP:
                state.advance(state.job.next_fire(datetime.fromtimestamp(now, UTC)))
                state.successor = None
                break
            state.advance(state.job.next_fire(state.next_fire))
            state.successor = fires[-1]
        return fires

    async def _after_previous(self, due: _Tick) -> None:
        state = due.job_state
        grace = self._grace(due.job, due.fire)
        state.waiting += 1
        try:
            # The previous run, or its lease release; waiters wake in the order they came.
            while not state.ready:
                await state.changed()
                if self.clock.now() - due.at > grace:
                    break  # missed already: said now, not once the job is free (if ever)
        finally:
            state.waiting -= 1
        late = self.clock.now() - due.at
        if self._stopping:
            due.abandon()
            return
        if late > grace:
            self._miss(due, f"{late:.3f}s late (waited)")
            return
        if not self._continue_hold(due):
            state.claim(due)
            self._start_batch([due])

    def _start_batch(self, batch: list[_Tick]) -> None:
        """Take the locks of the distributed jobs due now (one ``try_acquire_many``), start runs."""
        # Local jobs first: they need no lock, so no round trip to wait for.
        shared = [due for due in batch if due.job.distributed]
        if len(shared) < len(batch):
            self._launch([(due, None, None, None) for due in batch if not due.job.distributed])
        if shared and self._leadership is not None:
            runs: list[_Start] = []
            leader = self._leadership.lease
            for due in shared:
                if leader is None or not leader.held:
                    self._skip_held(due, "not the leader")
                elif due.at < self._leadership.since + 2 * self.skew_tolerance:
                    self._skip_held(due, "leadership too recent to rule out a late predecessor")
                else:
                    runs.append((due, None, leader.lost, leader.fencing_token))
            self._launch(runs)
        elif shared:
            for due in shared:
                due.acquire()
            self._lock_then_launch(shared)

    def _lock_then_launch(self, shared: list[_Tick], claimed: bool = False) -> None:
        """Take the locks of ``shared`` in one round trip, then start their runs: at once
        when the backend answers at once (memory://), else in a task. Where the backend
        claims ticks, the ticks of ``shared`` are claimed first (unless ``claimed``)."""
        if not claimed and self._claims.active:
            self._claim_then_lock(shared)
            return
        now = self.clock.now()
        hold = max(due.at + hold_span(due.job, self.skew_tolerance) - now for due in shared)
        names, ttl = [due.job.name for due in shared], max(hold, 0.0) + self.lease_ttl
        start = self._start_acquire
        try:
            started = None if start is None else start(names, ttl=ttl)
        except Exception as exc:
            self._lock_failed(shared, exc)
            return
        if started is not None and started.done():
            error = started.exception()
            if error is not None:
                self._lock_failed(shared, error)
            else:
                self._launch(self._granted(shared, started.result()))
            return
        self._spawn(self._lock_all(shared, names, ttl, started))

    async def _lock_all(
        self,
        shared: list[_Tick],
        names: list[str],
        ttl: float,
        started: asyncio.Future[Mapping[str, AsyncLease | None]] | None,
    ) -> None:
        leases: Mapping[str, AsyncLease | None]
        asked = time.perf_counter()
        try:
            if started is None:
                leases = await self._locker.try_acquire_many(names, ttl=ttl)
            else:  # in flight: a cancelled wait (stop) still releases what it grants
                leases = await undo_on_cancel(_outcome(started), _leases_of)
        except Exception as exc:
            self._lock_failed(shared, exc)
            return
        self._lock_wait = _average(self._lock_wait, time.perf_counter() - asked)
        self._launch(self._granted(shared, leases))

    def _claim_then_lock(self, shared: list[_Tick]) -> None:
        """Claim the ticks of ``shared`` (one round trip); lock and run those won, skip
        those another replica claimed: at once when the backend answers at once
        (memory://), else in a task."""
        ticks = {due.job.name: due.fire for due in shared}
        try:
            started = self._claims.started(ticks)
        except Exception as exc:
            self._claim_failed(shared, exc)
            return
        if started is not None and started.done():
            error = started.exception()
            if error is not None:
                self._claim_failed(shared, error)
            else:
                self._claimed(shared, started.result())
            return
        self._spawn(self._await_claims(shared, ticks, started))

    async def _await_claims(
        self,
        shared: list[_Tick],
        ticks: dict[str, datetime],
        started: asyncio.Future[Mapping[str, bool]] | None,
    ) -> None:
        asked = time.perf_counter()
        try:
            won = await (self._claims.claim(ticks) if started is None else started)
        except Exception as exc:
            self._claim_failed(shared, exc)
            return
        self._claim_wait = _average(self._claim_wait, time.perf_counter() - asked)
        self._claimed(shared, won)

    def _claim_failed(self, shared: list[_Tick], exc: BaseException) -> None:
        """The claims of ``shared`` failed. A backend refusing this locker its claims
        sends these ticks, and every later one, down the hold path."""
        if isinstance(exc, ClaimsUnavailable):
            self._claims.refuse(exc)
            self._lock_then_launch(shared)
        else:
            self._lock_failed(shared, exc)

    def _claimed(self, shared: list[_Tick], won: Mapping[str, bool]) -> None:
        winners = []
        for due in shared:
            if self._stopping:
                due.job_state.settle()
                due.abandon()
            elif won.get(due.job.name):
                winners.append(due)
            else:
                self._skip_held(due, "another replica claimed it")
        if winners:
            self._lock_then_launch(winners, claimed=True)

    def _lock_failed(self, shared: list[_Tick], exc: BaseException) -> None:
        """The locks of ``shared`` could not be taken: the scheduler goes on. An
        unreachable backend misses the ticks (one WARNING line for the first, then
        counts); anything else fails them (bad input without a traceback)."""
        if isinstance(exc, BackendUnavailable):
            problem = masked_line(exc)
            for due in shared:
                due.job_state.settle(due)
                due.miss()
                first = self._unanswered(problem, "ticks missed")
                reason = f"backend unavailable: {problem}"
                self._emit(
                    EventKind.MISSED, due.job, due.fire, error=exc, reason=reason, logged=first
                )
            return
        if isinstance(exc, ConfigurationError):
            reason = f"lock refused: {masked_line(exc)}"  # bad input: the reason, no traceback
        else:
            reason = "lock call failed"  # a backend's bug: its traceback follows
        for due in shared:
            due.job_state.settle(due)
            due.fail()
            self._emit(EventKind.FAILED, due.job, due.fire, error=exc, reason=reason)

    def _granted(
        self, shared: list[_Tick], leases: Mapping[str, AsyncLease | None]
    ) -> list[_Start]:
        """The runs to start, of the jobs ``shared`` whose lease is in ``leases``."""
        if self._outage.current is not None:
            self._answered()
        runs: list[_Start] = []
        now = self.clock.now()
        for due in shared:
            lease = leases.get(due.job.name)
            if self._stopping:  # granted while stopping: no run, so no hold either
                if lease is not None:  # let it go now: kept, other replicas would skip it
                    self._held.add(lease)
                    self._spawn(self._release(lease))  # a task: stop() waits for it
                due.job_state.settle(due)
                due.abandon()
            elif lease is None:
                self._skip_held(due, "another replica holds it")
            elif (late := now - due.at) > due.job.misfire_grace and not self._claiming(due.job):
                # Granted past the grace (a slow answer, a connection coming back): the
                # hold of a replica that won the tick in time covers tries up to the
                # grace, no later, so it may have run and released it already. (A
                # claimed tick is this replica's however late the grant: it runs.)
                self._held.add(lease)
                # Missed (no body runs: a tick meanwhile is no overlap), yet the job stays
                # busy until the lease is given back. In a task: no run tracks this
                # lease, and stop() must wait for its release.
                self._miss(due, f"{late:.3f}s late (granted)")
                self._spawn(self._release(lease, then=functools.partial(due.job_state.settle, due)))
            else:
                self._held.add(lease)
                runs.append((due, lease, lease.lost, lease.fencing_token))
        return runs

    def _launch(self, runs: list[_Start], made: _Made | None = None) -> None:
        """Start the bodies of ``runs``, then watch them (:class:`~multilock._scheduling.runs.Run`):
        every body is queued on the loop before any run's bookkeeping, so the last of
        many jobs due at one instant does not wait for every other job's. A run
        prepared ahead of its fire time starts at it (:meth:`_launch_at`); ``made``:
        the runs' contexts, made then."""
        if not runs:
            return
        now = self.clock.now()
        for start in runs:
            if start[0].at > now:
                runs = self._launch_later(runs, now)
                if not runs:
                    return
                break
        begun: list[tuple[RunContext, asyncio.Future[Any], float | None, _Starting | None]] = []
        report = wanted(_STARTED, self._listeners)  # asked once, not per run
        loop = asyncio.get_running_loop()
        contexts = None if made is None else iter(made)
        context = None
        for due, _, _, token in runs:
            due.start()
            if contexts is None:
                run = RunContext(due.job.name, due.fire, self.replica_id, token)
            else:
                context = next(contexts)
                run = run_in(context)
            if not due.job.is_async:  # started (and reported) when a worker thread runs it
                cell = _Starting(loop, self.clock)
                begun.append((run, self._submit(due, run, cell, context), None, cell))
                continue
            now = self.clock.now()
            if report:
                self._emit(_STARTED, due.job, due.fire, delay=now - due.at)
            begun.append((run, begin(due.job, run, context=context), now, None))
        extend = self._keep_alive
        for (due, lease, lost, _), (run, body, started, starting) in zip(runs, begun, strict=True):
            keepalive = (
                keep_alive(self._locker, lease, self.lease_ttl, self.clock, self._unanswered)
                if extend and lease is not None
                else None
            )
            watched = Run(self._run_host, due, lease, lost, run, body, started, loop)
            self._active.add(watched)
            if starting is not None:
                starting.run = watched
            watched.start(keepalive)

    def _launch_later(self, runs: list[_Start], now: float) -> list[_Start]:
        """Of ``runs``, those due by ``now`` (returned); the others start at their fire
        times, one task for the runs of each, their run contexts made now (work, and
        objects for the garbage collector, taken out of the instant)."""
        early: dict[float, tuple[list[_Start], _Made]] = {}
        due_now: list[_Start] = []
        for start in runs:
            due = start[0]
            at = due.at
            if at <= now:
                due_now.append(start)
                continue
            group = early.get(at)
            if group is None:
                group = early[at] = ([], [])
            run = RunContext(due.job.name, due.fire, self.replica_id, start[3])
            group[0].append(start)
            group[1].append(run_context(run))
        for at, (starts, made) in early.items():
            self._spawn(self._launch_at(at, starts, made))
        return due_now

    async def _launch_at(self, at: float, runs: list[_Start], made: _Made) -> None:
        """Start ``runs`` once the clock reads ``at``; at a stop meanwhile, none of them
        (their leases are in ``_held``: the stop releases them)."""
        try:
            await self.clock.sleep_until(at)
        except asyncio.CancelledError:
            self._abandon(runs)
            raise
        if self._stopping:
            self._abandon(runs)
        else:
            self._launch(runs, made)

    def _abandon(self, runs: list[_Start]) -> None:
        for due, _, _, _ in runs:
            due.job_state.settle(due)
            due.abandon()

    def _submit(
        self,
        due: _Tick,
        run: RunContext,
        starting: _Starting,
        context: contextvars.Context | None = None,
    ) -> asyncio.Future[Any]:
        """Start a sync job's body on the pool; a run that must wait for a free worker
        thread is counted, and the first of a crowd logged."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.max_workers, thread_name_prefix="multilock-job")
        self._workers_busy += 1
        if self._workers_busy > self.max_workers:
            if self._recorder is not None:
                self._recorder.worker_wait(due.job.name)
            if self._crowded.report("worker threads", "runs waited"):
                log.warning(
                    "job %s tick %s waits for a worker thread: all %d are busy (raise the"
                    " scheduler's max_workers)",
                    due.job.name,
                    due.fire.isoformat(),
                    self.max_workers,
                    extra={"job": due.job.name, "replica_id": self.replica_id},
                )
        elif self._crowded.current is not None:
            self._crowded.clear("worker threads free again")
        body = begin(due.job, run, self._pool, starting, context)
        body.add_done_callback(self._worker_free)
        return body

    def _worker_free(self, _: asyncio.Future[Any]) -> None:
        self._workers_busy = max(0, self._workers_busy - 1)

    def _skip_held(self, due: _Tick, reason: str) -> None:
        due.job_state.settle(due)
        due.skip()
        self._emit(EventKind.SKIPPED_HELD, due.job, due.fire, reason=reason)

    def _miss(self, due: _Tick, reason: str) -> None:
        due.miss()
        self._emit(EventKind.MISSED, due.job, due.fire, reason=reason)

    def _spawn(self, work: Any) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(work)
        self._runs.add(task)
        task.add_done_callback(self._forget)

    def _forget(self, task: asyncio.Task[None]) -> None:
        self._runs.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("scheduler bug in a run", exc_info=task.exception())
        self._check_quiet()

    # --- what a Run asks of its scheduler (its RunHost, made in __init__) -----------------

    def _grace(self, job: Job, fire: datetime, following: datetime | None = None) -> float:
        """How late (by this clock) ``fire`` may still start: the misfire grace, or with
        tick claims, more (see :func:`~multilock._scheduling.claims.claim_grace`)."""
        if not self._claiming(job):
            return job.misfire_grace
        return claim_grace(job.misfire_grace, fire, following or job.next_fire(fire))

    def _claiming(self, job: Job) -> bool:
        """Whether ``job``'s ticks are claimed (coalescing too: a tick won by a claim is
        one no replica has run, nor any later one, so it runs)."""
        return job.distributed and self._leadership is None and self._claims.active

    def _hold_until(self, job: Job, fire: datetime) -> float | None:
        """``fire + hold_span``, never past the next fire time: a replica firing this
        tick late finds it held; the next tick is this replica's to take over. ``None``
        (no hold: the lease goes as the run ends) where ticks are claimed.

        Rounded up to a 50 ms boundary (still never past the next fire): holding a
        little longer is as safe, and jobs spread over the second then end their
        holds on one shared timer per boundary instead of a timer and a loop turn each.
        """
        if self._claiming(job):
            return None  # the claim, not the lease, says the tick ran
        until = fire.timestamp() + hold_span(job, self.skew_tolerance)
        until = math.ceil(until * _HOLD_GRID) / _HOLD_GRID
        state = self._states.get(job.name)
        if state is not None and state.successor == fire:
            following = state.next_fire
        else:
            following = job.next_fire(fire)
        return until if following is None else min(until, following.timestamp())

    def _hold_timers(self) -> SharedTimers[Run]:
        if self._timers is None:
            self._timers = SharedTimers(self.clock, Run.hold_ended)
        return self._timers

    def _release_later(self, lease: AsyncLease, then: Callable[[], object]) -> None:
        """Release ``lease`` in the one task that releases whatever is due, then ``then()``:
        the holds of a tick's jobs end together, and a task each would cost more. A
        backend that sends its release at once (``release_started``) needs no task."""
        # _starts_release() said it: told to mypy alone (cast() is a call, once a run)
        started = lease.release_started() if _starts_release(type(lease)) else None  # type: ignore[attr-defined]
        if started is not None:
            self._held.discard(lease)
            if started.done():  # memory:// settles at once: no loop turn to wait for
                self._released(lease, started, then)
            else:
                started.add_done_callback(lambda done: self._released(lease, done, then))
            return
        self._releasing.append((lease, then))
        if not self._flushing:
            self._flushing = True
            self._spawn(self._flush_releases())

    async def _flush_releases(self) -> None:
        try:
            while self._releasing:
                batch, self._releasing = self._releasing, []
                # One round trip for all of them where the backend can (PostgreSQL, Redis).
                release_many = self._release_many
                if release_many is not None and len(batch) > 1:
                    leases = [lease for lease, _ in batch]
                    self._held.difference_update(leases)
                    try:
                        await release_many(leases)
                    except Exception as exc:  # the backend is gone: leases end with it, or by ttl
                        lost = all(lease.lost.is_set() for lease in leases)
                        self._release_failed(f"releasing {len(leases)} leases failed", exc, lost)
                else:
                    for lease, _ in batch:
                        await self._release(lease)
                for _, then in batch:
                    then()
        finally:
            self._flushing = False

    def _run_finished(self, run: Run) -> None:
        self._active.discard(run)
        self._check_quiet()

    def _check_quiet(self) -> None:
        quiet = self._quiet
        if quiet is not None and not quiet.done() and not self._active and not self._runs:
            quiet.set_result(None)

    async def _release(self, lease: AsyncLease, then: Callable[[], object] | None = None) -> None:
        self._held.discard(lease)
        try:
            await lease.release()
        except Exception as exc:  # the backend is gone: the lease ends with its session or ttl
            what = f"releasing the lease on {lease.name} failed"
            self._release_failed(what, exc, lease.lost.is_set())
        if then is not None:
            then()

    def _released(
        self, lease: AsyncLease, done: asyncio.Future[bool], then: Callable[[], object]
    ) -> None:
        error = done.exception()
        if error is not None:
            what = f"releasing the lease on {lease.name} failed"
            self._release_failed(what, error, lease.lost.is_set())
        then()

    def _release_failed(self, what: str, error: BaseException, lost: bool) -> None:
        """A release failed: the lease ends with its session or ttl. Expected of a lease
        already reported lost (DEBUG); an unreachable backend is one problem, reported
        once (no traceback); anything else is a bug."""
        if lost:
            log.debug("%s (the lease was lost): %s", what, masked_line(error))
        elif isinstance(error, BackendUnavailable):
            problem = masked_line(error)
            if self._unanswered(problem, "releases failed"):
                log.warning("%s: %s", what, problem)
        else:
            log.warning("%s", what, exc_info=error)

    def _emit(
        self,
        kind: EventKind,
        job: Job,
        fire: datetime,
        *,
        duration: float | None = None,
        delay: float | None = None,
        error: BaseException | None = None,
        reason: str | None = None,
        logged: bool = True,
    ) -> None:
        if not wanted(kind, self._listeners):
            return  # nobody would see it: skip building the event (twice a run)
        path = self.tick_path(job)
        event = JobEvent(
            kind, job.name, fire, self.replica_id, duration, delay, error, reason, path
        )
        emit(event, self._listeners, logged=logged)


def _average(average: float, sample: float) -> float:
    """A moving average of a backend's answer times, that follows a slower backend
    within a few answers."""
    return sample if average == 0.0 else 0.75 * average + 0.25 * sample


class _Starting:
    """A sync job's run until its body starts on a worker thread: called there as it
    starts, it tells the run on the loop (its lateness and timeout count from then)."""

    __slots__ = ("clock", "loop", "run")

    def __init__(self, loop: asyncio.AbstractEventLoop, clock: Clock) -> None:
        self.loop, self.clock = loop, clock
        self.run: Run | None = None  # set on the loop before any callback of it runs

    def __call__(self) -> None:
        try:
            self.loop.call_soon_threadsafe(self._started, self.clock.now())
        except RuntimeError:  # the loop is closed: the scheduler is gone, nobody to tell
            pass

    def _started(self, at: float) -> None:
        if self.run is not None:
            self.run.body_started(at)


def _leases_of(granted: Mapping[str, AsyncLease | None]) -> list[AsyncLease | None]:
    return list(granted.values())


@functools.cache
def _starts_release(lease_type: type) -> bool:
    """Whether leases of ``lease_type`` have ``release_started``
    (:class:`~multilock.abc.SupportsReleaseStarted`): asked once per type, not per
    release (a protocol's ``isinstance`` costs microseconds)."""
    return issubclass(lease_type, SupportsReleaseStarted)


def _outcome(started: asyncio.Future[T]) -> Outcome[T]:
    """``started`` as an :class:`Outcome` (cancellation cannot cancel it): the kit's are
    already; a third-party backend's future is awaited in a task of its own."""
    return started if isinstance(started, Outcome) else in_task(started)
