"""One run of one job: start it, watch it, stop it on timeout or a lost lease."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any

from ._clock import Clock
from ._events import EventKind
from ._jobs import Job, RunContext, start_run
from ._signal import LostSignal

__all__ = ["Outcome", "await_lost", "supervise", "wait_quietly"]

log = logging.getLogger("multilock.scheduler")

Outcome = tuple[EventKind, BaseException | None, str | None]
"""The kind of the final event, the job's exception (``failed``), and a reason."""


async def supervise(job: Job, run: RunContext, clock: Clock, lost: LostSignal | None) -> Outcome:
    """Run ``job`` to its end, its timeout, or the loss of ``lost``; never raises for the job.

    An async job is cancelled on timeout or loss. A sync job runs in a worker
    thread, which cannot be interrupted: its ``cancel_event`` is set and the run
    waits for it to return, so the lease is not released under a still-running
    body. If this task itself is cancelled (shutdown past its stop timeout), the
    job is cancelled (or flagged) and the cancellation propagates at once.
    """
    try:
        body = start_run(job, run)
    except Exception as exc:  # calling an async job failed before it ran (its arguments)
        return EventKind.FAILED, exc, None
    body.add_done_callback(_consume)
    guards: dict[asyncio.Future[Any], Outcome] = {}
    if lost is not None:
        guards[asyncio.ensure_future(await_lost(lost))] = (EventKind.LEASE_LOST, None, None)
    if job.timeout is not None:
        deadline = clock.now() + job.timeout
        timed_out: Outcome = (EventKind.TIMED_OUT, None, f"timeout of {job.timeout}s")
        guards[asyncio.ensure_future(clock.sleep_until(deadline))] = timed_out
    try:
        done, _ = await asyncio.wait({body, *guards}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        # Shutdown past its stop timeout: ask the body to stop, but do not wait for
        # it -- the caller releases the lease and a stuck worker thread is abandoned.
        run.cancel_event.set()
        body.cancel()
        if not isinstance(body, asyncio.Task) and not body.done():
            log.warning("job %s: its worker thread is still running at shutdown", job.name)
        raise
    finally:
        for guard in guards:
            guard.cancel()
    if body in done:
        if body.cancelled():
            return EventKind.FAILED, None, "the job cancelled itself"
        error = body.exception()
        if error is not None:
            return EventKind.FAILED, error, None
        return EventKind.SUCCEEDED, None, None
    fired = next(guard for guard in guards if guard in done)
    kind, _, reason = guards[fired]
    if kind is EventKind.LEASE_LOST and lost is not None:
        reason = lost.reason or "lease lost"
    await _stop_body(body, run)
    return kind, None, reason


async def await_lost(lost: LostSignal) -> str:
    """The reason, once ``lost`` fires (a coroutine, for tasks and ``asyncio.wait``)."""
    return await lost


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
