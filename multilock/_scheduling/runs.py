"""One run of one job: start it, watch it, hold its lease, end it.

Where the run is in its life (running, lost, timed out, holding, releasing, done) is
its :class:`~multilock._scheduling.run_states.RunLifecycle`'s to say: every change
goes through one of its transitions.

A run is driven by callbacks on the event loop, not by a task of its own: the
body's done callback, the lease's lost signal, a loop timer for the job's
timeout and one for the end of the lease hold. With a thousand jobs due at one
instant a task per run (plus a task per hold) cost more CPU than the bodies;
callbacks cost a few function calls.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from .._signal import LostSignal
from ..abc import AsyncLease
from .clock import Cancellable, Clock, SharedTimers, call_at
from .events import EventKind
from .jobs import Job, RunContext, start_run
from .run_states import JobState, RunLifecycle, RunState

__all__ = ["Emit", "Run", "RunHost", "begin", "wait_quietly"]

log = logging.getLogger("multilock.scheduler")
# Read off module globals: on Python 3.11 a member read off its Enum class goes through
# the metaclass's __getattr__ hook, several times the cost, and these are read per run.
_HOLDING, _RELEASING = RunState.HOLDING, RunState.RELEASING
_SUCCEEDED, _FAILED, _LEASE_LOST = EventKind.SUCCEEDED, EventKind.FAILED, EventKind.LEASE_LOST


def begin(
    job: Job,
    run: RunContext,
    executor: Executor | None = None,
    started: Callable[[], object] | None = None,
    context: contextvars.Context | None = None,
) -> asyncio.Future[Any]:
    """Start ``job``'s body now (a task, or on ``executor``'s worker threads for sync
    jobs, calling ``started()`` there as it starts); a failure to call it (its
    arguments) comes back as a failed future, reported as ``failed``."""
    try:
        return start_run(job, run, executor, started, context)
    except Exception as exc:
        failed: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        failed.set_exception(exc)
        return failed


class Emit(Protocol):
    """Report an event of a run (here: how the body ended)."""

    def __call__(
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
        """Report ``kind`` for the tick ``fire`` of ``job``."""


@dataclass(frozen=True, slots=True)
class RunHost:
    """What a run needs of its scheduler, and all it may use of it (the scheduler makes
    one, of its own methods)."""

    clock: Clock
    emit: Emit
    hold_until: Callable[[Job, datetime], float | None]
    """When (by the clock) the lease of the tick ``fire`` of ``job`` may be released."""
    hold_timers: Callable[[], SharedTimers[Run]]
    """Where a run's hold waits for its end (``Run.hold_ended`` at the deadline): one
    timer shared by the runs whose holds end at the same time."""
    release_later: Callable[[AsyncLease, Callable[[], object]], None]
    """Release ``lease`` (soon, on the loop), then call ``then()``."""
    run_finished: Callable[[Run], None]
    """The run is over: body, hold and release."""
    context: contextvars.Context
    """Where the run's callbacks run (the scheduler's, from its start): one for every
    run, where a callback added without one would copy the context, an object more per
    run for the garbage collector."""


class Run:
    """One tick's run, its body started: watch the body, report its outcome, keep the
    lease until the hold ends (or the next tick takes it over), release it.

    ``life`` is the tick's lifecycle, ``running`` when the run is made: the run moves it
    on as the body ends, the hold ends and the release completes. ``lost`` is the signal
    whose firing cancels the body: the job's lease, or the leader lease in leader mode
    (``lease`` is then ``None``: nothing to hold).
    """

    __slots__ = (
        "_cancel_timer",
        "_cut",
        "_hold_end",
        "_host",
        "_keepalive",
        "_loop",
        "body",
        "context",
        "fire",
        "job",
        "lease",
        "life",
        "lost",
        "started",
    )

    def __init__(
        self,
        host: RunHost,
        life: RunLifecycle[JobState],
        lease: AsyncLease | None,
        lost: LostSignal | None,
        context: RunContext,
        body: asyncio.Future[Any],
        started: float | None,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self._host = host
        self._loop = loop  # the scheduler's
        self.life = life
        life.run = self  # what the job's state hands over, while the life is holding
        self.job, self.fire = life.job, life.fire
        self.lease, self.lost = lease, lost
        # Both dropped once the body is over: a finished task keeps its coroutine and
        # context alive, and a run's hold keeps the run alive for most of a second,
        # long enough for the garbage collector to scan them again and again.
        self.context: RunContext | None = context
        self.body: asyncio.Future[Any] | None = body
        self.started = started  # None: a sync body waiting for a worker thread
        self._cut: tuple[EventKind, str] | None = None  # why the run stopped the body
        self._cancel_timer: Cancellable | None = None  # the job's timeout
        self._keepalive: asyncio.Task[None] | None = None
        self._hold_end: float | None = None  # while holding: when the hold ends

    def start(self, keepalive: asyncio.Task[None] | None) -> None:
        """Watch the body: its end, the lost signal, the job's timeout."""
        self._keepalive = keepalive
        assert self.body is not None
        self.body.add_done_callback(self, context=self._host.context)
        if self.started is not None:
            self._arm_timeout(self.started)
        if self.lost is not None:
            # One watch for the whole run: it stops the body, or ends the hold. The run
            # is the callback itself (__call__): a bound method would be one more object
            # per run for the garbage collector to trace through the hold.
            self.lost.add_callback(self)

    # --- the body ---------------------------------------------------------------------

    def body_started(self, at: float) -> None:
        """A sync body began on its worker thread at ``at`` (by the clock): its lateness
        is reported, and its timeout runs, from then."""
        if self.body is None or self.started is not None:
            return
        self.started = at
        self._host.emit(EventKind.STARTED, self.job, self.fire, delay=at - self.life.at)
        if self._cut is None:
            self._arm_timeout(at)

    def _arm_timeout(self, started: float) -> None:
        if self.job.timeout is not None:
            deadline = started + self.job.timeout
            self._cancel_timer = call_at(
                self._host.clock, deadline, self._timed_out, self._host.context
            )

    def _lost_while_running(self) -> None:
        reason = self.lost.reason if self.lost is not None else None
        self._stop_body(EventKind.LEASE_LOST, reason or "lease lost")

    def _timed_out(self) -> None:
        self._stop_body(EventKind.TIMED_OUT, f"timeout of {self.job.timeout}s")

    def _stop_body(self, kind: EventKind, reason: str) -> None:
        body, context = self.body, self.context
        if body is None or context is None or body.done() or self._cut is not None:
            return
        self._cut = (kind, reason)
        if kind is EventKind.LEASE_LOST:
            self.life.lose()
        elif kind is EventKind.TIMED_OUT:
            self.life.time_out()
        context.cancel_event.set()
        # A worker thread cannot be interrupted: its future ends when it returns, and
        # the lease stays held until then.
        if isinstance(body, asyncio.Task):
            body.cancel()

    def _body_done(self, body: asyncio.Future[Any]) -> None:
        self.body = self.context = None
        if self._cancel_timer is not None:
            self._cancel_timer.cancel()
            self._cancel_timer = None
        error: BaseException | None = None
        reason: str | None = None
        if self._cut is not None:
            kind, reason = self._cut
            if not body.cancelled():
                body.exception()  # retrieved: the outcome is the cut, not what it raised
        elif body.cancelled():
            kind, reason = EventKind.FAILED, "the job cancelled itself"
        else:
            error = body.exception()
            kind = _SUCCEEDED if error is None else _FAILED
        duration = None if self.started is None else self._host.clock.now() - self.started
        self._host.emit(kind, self.job, self.fire, duration=duration, error=error, reason=reason)
        if self.life.over:
            return  # ended at shutdown just before: the scheduler releases its lease
        # The life moves on from its body states: the job no longer runs (the job's state
        # reads that off the life); whoever waits for the job is woken once it is free.
        if self.lease is not None and kind is not _LEASE_LOST:
            self._hold(self.lease)
        else:
            self._release()

    # --- the hold ---------------------------------------------------------------------

    def _hold(self, lease: AsyncLease) -> None:
        """Keep the lease until the hold ends, so that a replica firing this tick late
        finds it held; the next tick of this job may take it over meanwhile."""
        until = self._host.hold_until(self.job, self.fire)
        if until is None or not lease.held:  # None: no hold (the tick was claimed)
            self._release()
            return
        self.life.hold()  # the job is ready again: the next tick may take ``lease`` over
        self.life.job_state.notify()
        self._hold_end = until
        self._host.hold_timers().add(until, self)

    def handed_over(self) -> None:
        """The next tick's run took the lease over (``_JobState.take_hold``): the hold
        ends, and the lease is not this run's to release."""
        self._end_hold()
        self._finish(settle=False)

    def hold_ended(self) -> None:
        """The hold is over (its time came, or the lease was lost): release the lease."""
        if self.life.state is _HOLDING:  # else handed over, or ended at shutdown
            self._end_hold()
            self._release()

    def _end_hold(self) -> None:
        until, self._hold_end = self._hold_end, None
        if until is not None:
            self._host.hold_timers().discard(until, self)

    # --- the end ----------------------------------------------------------------------

    def _release(self) -> None:
        if self.lease is None:
            self._finish(settle=True)
        else:
            self.life.release()
            self._host.release_later(self.lease, self._finish_settled)

    def _finish_settled(self) -> None:
        if self.life.state is _RELEASING:  # else aborted meanwhile, at shutdown
            self._finish(settle=True)

    def _finish(self, *, settle: bool) -> None:
        self.life.finish()
        self._unwatch_lost()
        if self._cancel_timer is not None:  # the timeout of a body abandoned at shutdown
            self._cancel_timer.cancel()
            self._cancel_timer = None
        if self._keepalive is not None:
            self._keepalive.cancel()
        if settle:
            self.life.job_state.settle(self.life)
        self._host.run_finished(self)

    def abort(self) -> None:
        """Shutdown past its stop timeout: stop the body without waiting for it (a stuck
        worker thread is abandoned), end the hold; the scheduler releases the lease."""
        body = self.body
        if body is not None and not body.done():
            self._stop_body(EventKind.FAILED, "stopped")
            if not isinstance(body, asyncio.Task):
                log.warning("job %s: its worker thread is still running at shutdown", self.job.name)
            body.remove_done_callback(self)
            body.add_done_callback(_consume)
        self._end_hold()
        self._finish(settle=True)

    # --- the run is the callback of its body and of its lost signal -------------------------

    def __call__(self, what: str | asyncio.Future[Any]) -> None:
        """The body ended (``what`` is the body, on the loop), or the lease (or leader
        lease) was lost (``what`` is the reason, from any thread, as the signal fires).
        One callable for both: a bound method each would be two more objects per run
        for the garbage collector to trace while the run is in flight."""
        if not isinstance(what, str):
            self._body_done(what)
            return
        loop = self._loop
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:  # another thread: a backend's, or a sync job's worker
            on_loop = False
        if on_loop:
            self._lost()
        elif not loop.is_closed():
            loop.call_soon_threadsafe(self._lost)

    def _lost(self) -> None:
        if self.body is not None and not self.body.done():
            self._lost_while_running()
        elif self._hold_end is not None:
            self.hold_ended()

    def _unwatch_lost(self) -> None:
        if self.lost is not None:
            self.lost.remove_callback(self)


async def wait_quietly(work: Awaitable[Any]) -> None:
    """Wait for ``work`` to finish without raising what it raised (cancellation of the
    caller still propagates)."""
    future = asyncio.ensure_future(work)
    await asyncio.wait({future})
    _consume(future)


def _consume(future: asyncio.Future[Any]) -> None:
    # Marks the exception as retrieved: reported through events, not by asyncio's GC hook.
    if future.done() and not future.cancelled():
        future.exception()
