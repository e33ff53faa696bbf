"""One run of one job: start it, watch it, stop it on timeout or a lost lease."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable
from typing import Any

from ._clock import Clock, call_at
from ._events import EventKind
from ._jobs import Job, RunContext, start_run
from ._signal import LostSignal

__all__ = ["Outcome", "Wakeup", "begin", "supervise", "wait_quietly"]

log = logging.getLogger("multilock.scheduler")

Outcome = tuple[EventKind, BaseException | None, str | None]
"""The kind of the final event, the job's exception (``failed``), and a reason."""


def begin(job: Job, run: RunContext) -> asyncio.Future[Any]:
    """Start ``job``'s body now (a task, or a worker thread for sync jobs); a failure to
    call it (its arguments) comes back as a failed future, reported by :func:`supervise`."""
    try:
        return start_run(job, run)
    except Exception as exc:
        failed: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        failed.set_exception(exc)
        return failed


async def supervise(
    job: Job,
    run: RunContext,
    body: asyncio.Future[Any],
    started: float,
    clock: Clock,
    lost: LostSignal | None,
) -> Outcome:
    """Watch ``body`` (from :func:`begin`, at ``started`` by ``clock``) to its end, the
    job's timeout, or the loss of ``lost``; never raises for the job.

    An async job is cancelled on timeout or loss. A sync job runs in a worker
    thread, which cannot be interrupted: its ``cancel_event`` is set and the run
    waits for it to return, so the lease is not released under a still-running
    body. If this task itself is cancelled (shutdown past its stop timeout), the
    job is cancelled (or flagged) and the cancellation propagates at once.
    """
    body.add_done_callback(_consume)
    # One future woken by whichever comes first: no guard tasks, no asyncio.wait. Armed
    # before the sources are added: a lease lost already wakes it at once.
    wake = Wakeup()
    woken = wake.wait()
    body.add_done_callback(wake)
    if lost is not None:
        lost.add_callback(wake.from_any_thread)
    cancel_timer = None
    if job.timeout is not None:
        cancel_timer = call_at(clock, started + job.timeout, wake)
    try:
        await woken
    except asyncio.CancelledError:
        # Shutdown past its stop timeout: ask the body to stop, but do not wait for
        # it -- the caller releases the lease and a stuck worker thread is abandoned.
        run.cancel_event.set()
        body.cancel()
        if not isinstance(body, asyncio.Task) and not body.done():
            log.warning("job %s: its worker thread is still running at shutdown", job.name)
        raise
    finally:
        body.remove_done_callback(wake)
        if lost is not None:
            lost.remove_callback(wake.from_any_thread)
        if cancel_timer is not None:
            cancel_timer()
    if body.done():
        if body.cancelled():
            return EventKind.FAILED, None, "the job cancelled itself"
        error = body.exception()
        if error is not None:
            return EventKind.FAILED, error, None
        return EventKind.SUCCEEDED, None, None
    if lost is not None and lost.is_set():
        outcome: Outcome = (EventKind.LEASE_LOST, None, lost.reason or "lease lost")
    else:
        outcome = (EventKind.TIMED_OUT, None, f"timeout of {job.timeout}s")
    await _stop_body(body, run)
    return outcome


class Wakeup:
    """A future to await, completed by the first of several sources: done callbacks of
    futures (``fut.add_done_callback(wakeup)``), a lost signal from any thread
    (``signal.add_callback(wakeup.from_any_thread)``), or a direct call.

    Cheaper than a task per source and ``asyncio.wait``. :meth:`wait` arms a new
    future each time; a wake while none is armed is dropped, so re-check the
    conditions before each :meth:`wait` (nothing can happen between the check and
    the wait: both run on the loop without yielding).
    """

    __slots__ = ("_future", "_loop", "_thread")

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()
        self._future: asyncio.Future[None] | None = None

    def wait(self) -> asyncio.Future[None]:
        """A fresh future, completed by the next wake."""
        self._future = self._loop.create_future()
        return self._future

    def __call__(self, *_: object) -> None:
        """Wake the waiter (on the loop's thread)."""
        future = self._future
        if future is not None and not future.done():
            future.set_result(None)

    def from_any_thread(self, *_: object) -> None:
        """Wake the waiter from whichever thread calls (a backend's lost signal)."""
        if threading.get_ident() == self._thread:
            self()
        elif not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self)


async def _stop_body(body: asyncio.Future[Any], run: RunContext) -> None:
    run.cancel_event.set()
    if isinstance(body, asyncio.Task):
        body.cancel()
    # A worker thread cannot be cancelled: its future completes when it returns.
    await wait_quietly(body)


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
