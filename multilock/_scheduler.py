"""The scheduler: fires jobs on triggers, exactly once per tick across replicas."""

from __future__ import annotations

import asyncio
import inspect
import os
import signal
import socket
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import Any, Literal, Self, TypeVar

from ._clock import Clock, SystemClock
from ._durations import Duration, parse_duration
from ._events import EventKind, JobEvent, Listener, emit, log
from ._file import default_directory
from ._jobs import Job, Overlap, RunContext, parse_timeout, validate_schedule
from ._keys import advisory_key
from ._metrics import metrics_listener
from ._registry import connect_async
from ._runs import supervise, wait_quietly
from ._signal import LostSignal
from ._triggers import Trigger
from ._walltime import as_timezone
from .abc import AsyncDistributedLock, AsyncLease, Capability
from .errors import ConfigurationError

__all__ = ["Scheduler"]

FuncT = TypeVar("FuncT", bound=Callable[..., Any])
Coordination = Literal["lock", "leader"]
_MAX_CATCH_UP = 1000  # ticks walked one by one after a pause; beyond, they are skipped in bulk


@dataclass
class _JobState:
    job: Job
    next_fire: datetime | None = None
    running: bool = False  # a body runs (what ``overlap`` is about)
    settled: asyncio.Event = field(default_factory=asyncio.Event)  # no body, no lease held

    def claim(self) -> None:
        """Mark a run as started; synchronous, so two ticks cannot both claim."""
        self.running = True
        self.settled.clear()

    def settle(self) -> None:
        """The run is over and its lease released."""
        self.running = False
        self.settled.set()


@dataclass
class _Due:
    job: Job
    fire: datetime
    state: _JobState = field(repr=False)


class Scheduler:
    """Runs jobs on triggers; a distributed job runs once per tick across all replicas.

    ``lock`` is a lock URL, an async locker (``multilock.connect_async(...)``),
    or ``None`` for ``file://`` in a per-user directory (replicas on one host).
    See ``docs/scheduler.md`` for the exactly-once guarantee and its limits.
    """

    def __init__(
        self,
        lock: str | AsyncDistributedLock | None = None,
        *,
        timezone: str = "UTC",
        skew_tolerance: Duration = 1.0,
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
    ) -> None:
        if lock is None:
            lock = "file://" + str(default_directory())
        if isinstance(lock, str):
            self._locker = connect_async(lock)
            self._owns_locker = True
        else:
            if not inspect.iscoroutinefunction(getattr(lock, "try_acquire_many", None)):
                raise ConfigurationError(
                    "Scheduler(lock=...) takes a URL or an async locker"
                    " (multilock.connect_async(url)), not a sync one"
                )
            self._locker = lock
            self._owns_locker = False
        if coordination not in ("lock", "leader"):
            raise ConfigurationError(
                f"invalid coordination {coordination!r} (expected 'lock' or 'leader')"
            )
        self.timezone = as_timezone(timezone)
        self.skew_tolerance = parse_duration(skew_tolerance, what="skew_tolerance")
        self.misfire_grace = (
            self.skew_tolerance / 2
            if misfire_grace is None
            else parse_duration(misfire_grace, what="misfire_grace")
        )
        self.coalesce = coalesce
        self.stop_timeout = parse_duration(stop_timeout, what="stop_timeout")
        self.coordination: Coordination = coordination
        self.leader_name = leader_name
        self.leader_poll = parse_duration(leader_poll, what="leader_poll")
        self.lease_ttl = parse_duration(lease_ttl, what="lease_ttl")
        self.replica_id = replica_id or f"{socket.gethostname()}-{os.getpid()}"
        self.clock: Clock = clock or SystemClock()
        self._listeners: list[Listener] = []
        if metrics:
            recorder = metrics_listener(registry)
            if recorder is not None:
                self._listeners.append(recorder)
        self._states: dict[str, _JobState] = {}
        self._keys: dict[int, str] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runs: set[asyncio.Task[None]] = set()
        self._held: set[AsyncLease] = set()  # released at stop even if a run never started
        self._tasks: list[asyncio.Task[None]] = []
        self._wake: asyncio.Event | None = None
        self._stopping = False
        self._stop_requested: asyncio.Event | None = None
        self._leader: AsyncLease | None = None
        self._leader_since = 0.0
        self._thread: threading.Thread | None = None

    # --- registration ---------------------------------------------------------------

    def job(
        self,
        trigger: Trigger,
        *,
        name: str | None = None,
        timeout: Duration | None = None,
        overlap: Overlap = "reschedule",
        distributed: bool = True,
        misfire_grace: Duration | None = None,
        coalesce: bool | None = None,
        timezone: str | None = None,
        args: Iterable[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Callable[[FuncT], FuncT]:
        """Decorator form of :meth:`add_job`; returns the function unchanged."""

        def register(func: FuncT) -> FuncT:
            self.add_job(
                func,
                trigger,
                name=name,
                timeout=timeout,
                overlap=overlap,
                distributed=distributed,
                misfire_grace=misfire_grace,
                coalesce=coalesce,
                timezone=timezone,
                args=args,
                kwargs=kwargs,
            )
            return func

        return register

    def add_job(
        self,
        func: Callable[..., Any],
        trigger: Trigger,
        *,
        name: str | None = None,
        timeout: Duration | None = None,
        overlap: Overlap = "reschedule",
        distributed: bool = True,
        misfire_grace: Duration | None = None,
        coalesce: bool | None = None,
        timezone: str | None = None,
        args: Iterable[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Job:
        """Register ``func`` to run on ``trigger``; every problem is reported here.

        ``name`` is the lock name (default: the function's qualified name).
        ``timeout`` cancels the run (a sync job sees ``current_run().cancelled``).
        ``overlap``: when the previous run in this process is still going,
        ``"reschedule"`` skips the tick and ``"wait"`` runs it after, if still
        within ``misfire_grace``. ``distributed=False`` runs on every replica.
        ``args``/``kwargs`` are bound now and passed to every run.
        """
        if not callable(func):
            raise ConfigurationError(f"a job must be callable, not {type(func).__name__}")
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
        if overlap not in ("reschedule", "wait"):
            raise ConfigurationError(
                f"job {name!r}: invalid overlap {overlap!r} (expected 'reschedule' or 'wait')"
            )
        job = Job(
            name=name,
            func=func,
            trigger=trigger,
            timezone=self.timezone if timezone is None else as_timezone(timezone),
            timeout=parse_timeout(timeout),
            overlap=overlap,
            distributed=distributed,
            misfire_grace=(
                self.misfire_grace
                if misfire_grace is None
                else parse_duration(misfire_grace, what="misfire_grace")
            ),
            coalesce=self.coalesce if coalesce is None else coalesce,
            args=tuple(args),
            kwargs=dict(kwargs or {}),
        )
        validate_schedule(job, self._now(), self.skew_tolerance)
        key = advisory_key(name)
        if name in self._states:
            raise ConfigurationError(f"a job named {name!r} is already registered")
        if key in self._keys:
            raise ConfigurationError(
                f"job names {name!r} and {self._keys[key]!r} have the same advisory key"
                f" {key}: rename one"
            )
        self._keys[key] = name
        state = _JobState(job)
        self._states[name] = state
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._install, state)
        return job

    def remove_job(self, name: str) -> None:
        """Stop scheduling ``name`` (a run in progress finishes)."""
        state = self._states.pop(name, None)
        if state is None:
            raise KeyError(f"no job named {name!r}")
        self._keys.pop(advisory_key(name), None)

    @property
    def jobs(self) -> list[Job]:
        """The registered jobs."""
        return [state.job for state in self._states.values()]

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener(event)`` with every :class:`~multilock.JobEvent`."""
        self._listeners.append(listener)

    @property
    def is_leader(self) -> bool:
        """In leader mode, whether this replica currently leads."""
        return self._leader is not None and self._leader.held

    # --- lifecycle ----------------------------------------------------------------

    async def start(self) -> None:
        """Start firing jobs on the running event loop; returns at once."""
        if self._loop is not None:
            raise RuntimeError("this Scheduler is already running")
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._stop_requested = asyncio.Event()
        self._stopping = False
        for state in self._states.values():
            self._install(state)
        self._tasks.append(asyncio.create_task(self._serve(), name="multilock-scheduler"))
        if self.coordination == "leader":
            self._tasks.append(asyncio.create_task(self._lead(), name="multilock-leader"))
        log.info(
            "scheduler started: %d jobs, replica %s, lock %s, coordination %s",
            len(self._states),
            self.replica_id,
            self._locker.url,
            self.coordination,
            extra={"replica_id": self.replica_id},
        )

    async def stop(self) -> None:
        """Stop: no new runs; wait up to ``stop_timeout`` for running ones (their lease
        holds included), cancel the rest, release every lease."""
        if self._loop is None:
            return
        self._stopping = True
        assert self._wake is not None
        self._wake.set()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            await wait_quietly(task)
        self._tasks.clear()
        if self._runs:
            await asyncio.wait(set(self._runs), timeout=self.stop_timeout)
        for task in list(self._runs):
            task.cancel()
        for task in list(self._runs):
            await wait_quietly(task)
        for lease in list(self._held):
            await self._release(lease)
        if self._leader is not None:
            await self._leader.release()
            self._leader = None
        if self._owns_locker:
            await self._locker.aclose()
        self._loop = None
        log.info("scheduler stopped", extra={"replica_id": self.replica_id})

    def request_stop(self) -> None:
        """Ask :meth:`run` / :meth:`serve` to stop (safe from any thread and signal handlers)."""
        loop, event = self._loop, self._stop_requested
        if loop is not None and event is not None:
            loop.call_soon_threadsafe(event.set)

    async def serve(self) -> None:
        """Start, run until :meth:`request_stop`, then stop."""
        await self.start()
        try:
            assert self._stop_requested is not None
            await self._stop_requested.wait()
        finally:
            await self.stop()

    def run(self) -> None:
        """Run in the calling thread until SIGTERM or SIGINT, then shut down gracefully."""
        asyncio.run(self._serve_with_signals())

    async def _serve_with_signals(self) -> None:
        loop = asyncio.get_running_loop()
        installed = []
        for signum in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(signum, self.request_stop)
                installed.append(signum)
            except (NotImplementedError, RuntimeError, ValueError):
                pass  # not the main thread, or no signals here: request_stop() still works
        try:
            await self.serve()
        finally:
            for signum in installed:
                loop.remove_signal_handler(signum)

    def start_in_background(self) -> None:
        """Run on an event loop in a daemon thread (for sync applications)."""
        if self._thread is not None:
            raise RuntimeError("this Scheduler is already running in the background")
        started = threading.Event()
        failure: list[BaseException] = []

        async def main() -> None:
            try:
                await self.start()
            except BaseException as exc:
                failure.append(exc)
                raise
            finally:
                started.set()
            assert self._stop_requested is not None
            try:
                await self._stop_requested.wait()
            finally:
                await self.stop()

        self._thread = threading.Thread(
            target=asyncio.run, args=(main(),), name="multilock-scheduler", daemon=True
        )
        self._thread.start()
        started.wait()
        if failure:
            self._thread.join()
            self._thread = None
            raise failure[0]

    def shutdown(self, timeout: float | None = None) -> None:
        """Stop the background scheduler and wait for it (see :meth:`stop`)."""
        thread = self._thread
        if thread is None:
            return
        self.request_stop()
        thread.join(self.stop_timeout + 5 if timeout is None else timeout)
        if thread.is_alive():
            raise TimeoutError("the background scheduler did not stop in time")
        self._thread = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

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
        state.next_fire = state.job.next_fire(since)
        state.settled = asyncio.Event()  # bound to this loop
        state.settle()
        if self._wake is not None:
            self._wake.set()

    async def _serve(self) -> None:
        assert self._wake is not None
        while not self._stopping:
            upcoming = [s.next_fire for s in self._states.values() if s.next_fire is not None]
            waits: set[asyncio.Future[Any]] = {asyncio.ensure_future(self._wake.wait())}
            if upcoming:
                deadline = min(upcoming).timestamp()
                waits.add(asyncio.ensure_future(self.clock.sleep_until(deadline)))
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in waits:
                    waiter.cancel()
            self._wake.clear()
            if not self._stopping:
                await self._fire_due()

    async def _fire_due(self) -> None:
        now = self.clock.now()
        batch: list[_Due] = []
        for state in list(self._states.values()):
            job = state.job
            fires = self._pop_due(state, now)
            if not fires:
                continue
            fresh = [f for f in fires if now - f.timestamp() <= job.misfire_grace]
            for fire in fires[: len(fires) - len(fresh)]:  # the late ones come first
                late = now - fire.timestamp()
                self._emit(EventKind.MISSED, job, fire, reason=f"{late:.3f}s late")
            if job.coalesce and len(fresh) > 1:
                for fire in fresh[:-1]:
                    self._emit(EventKind.MISSED, job, fire, reason="coalesced")
                fresh = fresh[-1:]
            for i, fire in enumerate(fresh):
                if state.running or i > 0:
                    if job.overlap == "reschedule" and i == 0:
                        self._emit(EventKind.SKIPPED_OVERLAP, job, fire, reason="still running")
                    else:
                        self._spawn(self._after_previous(_Due(job, fire, state)))
                else:
                    state.claim()  # now: the run starts on a later loop turn
                    batch.append(_Due(job, fire, state))
        if batch:
            await self._start_batch(batch)

    def _pop_due(self, state: _JobState, now: float) -> list[datetime]:
        fires: list[datetime] = []
        while state.next_fire is not None and state.next_fire.timestamp() <= now:
            fires.append(state.next_fire)
            if len(fires) >= _MAX_CATCH_UP:
                state.next_fire = state.job.next_fire(datetime.fromtimestamp(now, UTC))
                break
            state.next_fire = state.job.next_fire(state.next_fire)
        return fires

    async def _after_previous(self, due: _Due) -> None:
        state = due.state
        while not state.settled.is_set():  # the previous run and its lease hold
            await state.settled.wait()
        late = self.clock.now() - due.fire.timestamp()
        if self._stopping:
            return
        if late > due.job.misfire_grace:
            self._emit(EventKind.MISSED, due.job, due.fire, reason=f"{late:.3f}s late (waited)")
            return
        state.claim()
        await self._start_batch([due])

    async def _start_batch(self, batch: list[_Due]) -> None:
        """Take the locks of the distributed jobs due now (one ``try_acquire_many``), start runs."""
        local = [due for due in batch if not due.job.distributed]
        shared = [due for due in batch if due.job.distributed]
        for due in local:
            self._spawn(self._execute(due, None, None))
        if not shared:
            return
        if self.coordination == "leader":
            leader = self._leader
            for due in shared:
                if leader is None or not leader.held:
                    self._skip_held(due, "not the leader")
                elif due.fire.timestamp() < self._leader_since + self.skew_tolerance:
                    self._skip_held(due, "leadership too recent to rule out a late predecessor")
                else:
                    self._spawn(self._execute(due, None, leader.lost))
            return
        now = self.clock.now()
        hold = max(due.fire.timestamp() + self.skew_tolerance - now for due in shared)
        try:
            leases = await self._locker.try_acquire_many(
                [due.job.name for due in shared], ttl=max(hold, 0.0) + self.lease_ttl
            )
        except Exception as exc:  # the backend could not be asked: these ticks fail, loop goes on
            for due in shared:
                due.state.settle()
                self._emit(
                    EventKind.FAILED, due.job, due.fire, error=exc, reason="lock unavailable"
                )
            return
        for due in shared:
            lease = leases.get(due.job.name)
            if lease is None:
                self._skip_held(due, "another replica holds it")
            else:
                self._held.add(lease)
                self._spawn(self._execute(due, lease, lease.lost))

    def _skip_held(self, due: _Due, reason: str) -> None:
        due.state.settle()
        self._emit(EventKind.SKIPPED_HELD, due.job, due.fire, reason=reason)

    def _spawn(self, work: Any) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(work)
        self._runs.add(task)
        task.add_done_callback(self._runs.discard)

    async def _execute(self, due: _Due, lease: AsyncLease | None, lost: LostSignal | None) -> None:
        job, fire = due.job, due.fire
        keepalive = self._keep_alive(lease) if lease is not None else None
        try:
            token = lease.fencing_token if lease is not None else None
            run = RunContext(job.name, fire, self.replica_id, token, threading.Event())
            started = self.clock.now()
            self._emit(EventKind.STARTED, job, fire, delay=started - fire.timestamp())
            try:
                kind, error, reason = await supervise(job, run, self.clock, lost)
            finally:
                due.state.running = False
            duration = self.clock.now() - started
            self._emit(kind, job, fire, duration=duration, error=error, reason=reason)
            if lease is not None and kind is not EventKind.LEASE_LOST:
                await self._hold(job, fire, lease)
        finally:
            if keepalive is not None:
                keepalive.cancel()
            if lease is not None:
                await self._release(lease)
            due.state.settle()

    async def _release(self, lease: AsyncLease) -> None:
        self._held.discard(lease)
        try:
            await lease.release()
        except Exception:  # the backend is gone: the lease ends with its session or ttl
            log.warning("releasing the lease on %s failed", lease.name, exc_info=True)

    async def _hold(self, job: Job, fire: datetime, lease: AsyncLease) -> None:
        """Keep the lease until ``fire + skew_tolerance`` (never past the next fire time),
        so that a replica firing this tick late finds it held."""
        until = fire + timedelta(seconds=self.skew_tolerance)
        following = job.next_fire(fire)
        if following is not None:
            until = min(until, following)
        if until.timestamp() > self.clock.now() and lease.held:
            await self.clock.sleep_until(until.timestamp())

    def _keep_alive(self, lease: AsyncLease) -> asyncio.Task[None] | None:
        caps: frozenset[Capability] = getattr(self._locker, "capabilities", frozenset())
        if Capability.TTL not in caps or Capability.RENEWAL in caps:
            return None  # session-bound, or the backend renews by itself
        return asyncio.ensure_future(self._extend_periodically(lease))

    async def _extend_periodically(self, lease: AsyncLease) -> None:
        while lease.held:
            await self.clock.sleep_until(self.clock.now() + self.lease_ttl / 3)
            try:
                await lease.extend(self.lease_ttl)
            except Exception:
                log.warning("extending the lease on %s failed", lease.name, exc_info=True)
                return

    async def _lead(self) -> None:
        """Leader mode: hold one renewed leader lease; retry every ``leader_poll`` when not."""
        while not self._stopping:
            try:
                lease = await self._locker.try_acquire(self.leader_name, ttl=self.lease_ttl)
            except Exception:
                log.warning("leader election: the lock could not be asked", exc_info=True)
                lease = None
            if lease is None:
                await self.clock.sleep_until(self.clock.now() + self.leader_poll)
                continue
            self._leader, self._leader_since = lease, self.clock.now()
            log.info("this replica leads", extra={"replica_id": self.replica_id})
            keepalive = self._keep_alive(lease)
            try:
                reason = await lease.lost
            finally:
                if keepalive is not None:
                    keepalive.cancel()
            self._leader = None
            log.warning("leadership lost: %s", reason, extra={"replica_id": self.replica_id})
            # Back off one poll before trying again, so that a flapping leader yields.
            await self.clock.sleep_until(self.clock.now() + self.leader_poll)

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
    ) -> None:
        event = JobEvent(kind, job.name, fire, self.replica_id, duration, delay, error, reason)
        emit(event, self._listeners)
