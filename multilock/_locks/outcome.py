"""Cancellation-safe calls: an operation in flight finishes, whatever the caller's
cancellation says.

:class:`Outcome` is a future that cancellation cannot cancel; :func:`in_task` runs a
coroutine in a task of its own that settles one; :func:`finish_shielded` is the seed
pattern's ``context.WithoutCancel`` (a release that has started finishes before the
loop is torn down); :func:`undo_on_cancel` lets an acquire interrupted by cancellation
finish, then releases what it granted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

__all__ = [
    "Outcome",
    "finish_shielded",
    "in_task",
    "settle_in_task",
    "undo_on_cancel",
    "wait_finished",
    "wait_settled",
]

T = TypeVar("T")
R = TypeVar("R")


async def finish_shielded(work: Awaitable[T]) -> T:
    """Run ``work`` to the end even if the caller is cancelled meanwhile.

    Unlike a bare :func:`asyncio.shield`, the caller does not return early: it
    waits for the work, then re-raises the cancellation. That is the
    ``context.WithoutCancel`` of the seed pattern: a release that has started
    finishes before ``asyncio.run`` or a task group tears the loop down.

    The work runs in a task of its own, on purpose: timeouts *inside* it
    (redis-py's ``socket_timeout`` is an ``asyncio.timeout`` that cancels the
    current task) must still fire. Driving it in the caller's task with
    cancellation held back was tried and made a blackholed release hang.
    """
    return await wait_finished(in_task(work))


async def wait_finished(outcome: Outcome[T]) -> T:
    """Await ``outcome``; if the caller is cancelled meanwhile, wait until it is settled,
    then raise its own error (or its own cancellation), else the caller's cancellation."""
    try:
        return await outcome
    except asyncio.CancelledError:
        await wait_settled(outcome)
        outcome.result()
        raise


def in_task(work: Awaitable[T]) -> Outcome[T]:
    """Run ``work`` in a task of its own; the :class:`Outcome` that task settles as it ends.

    Awaiting the outcome is :func:`asyncio.shield` without its extra event-loop turn: a
    shield's outer future is settled from the task's done callback, one turn after the
    task ends, and only then is the caller woken.
    """
    outcome: Outcome[T] = Outcome()
    settle_in_task(outcome, work)
    return outcome


def settle_in_task(
    outcome: Outcome[T], work: Awaitable[T], loop: asyncio.AbstractEventLoop | None = None
) -> None:
    """Run ``work`` in a task of its own (on ``loop``, else the running one) that settles
    ``outcome`` as it ends: how a call started without a task hands over to its task
    path when something unusual happens."""
    # The outcome keeps the task alive: the loop itself holds tasks only weakly.
    outcome.task = (loop or asyncio.get_running_loop()).create_task(_settle(work, outcome))


async def _settle(work: Awaitable[T], outcome: Outcome[T]) -> None:
    try:
        result = await work
    except BaseException as exc:
        outcome.set_exception(exc)  # a CancelledError too: the work's own cancellation
        if not isinstance(exc, Exception):
            raise
    else:
        outcome.set_result(result)


class Outcome(asyncio.Future[T]):
    """The outcome of an operation already in flight, as the ``_start_*`` hooks return it:
    a future that cancellation cannot cancel.

    A task awaiting it and cancelled meanwhile gets its ``CancelledError`` once the
    outcome is settled (``Task.cancel`` then finds a waiter that refuses to be
    cancelled and delivers the cancellation at the task's next step), with the outcome
    still readable. So the base waits for a started operation as
    :func:`finish_shielded` does, without the task and the shield, which cost a few
    event-loop turns per call. Whatever settles it must do so by a deadline of its
    own: nothing else can end the wait.
    """

    task: asyncio.Future[None] | None = None  # the task that settles it (see in_task)

    def cancel(self, msg: Any = None) -> bool:
        """Refuse: an outcome is settled by the operation, never cancelled."""
        return False


async def wait_settled(outcome: Outcome[Any]) -> None:
    """Wait until ``outcome`` is settled, whatever further cancellations say. A
    cancellation lands once it is settled (see :class:`Outcome`): this is the safety net."""
    while not outcome.done():
        try:
            await asyncio.wait((outcome,))
        except asyncio.CancelledError:
            pass


async def undo_on_cancel(
    work: Coroutine[Any, Any, R] | Outcome[R], leases_of: Callable[[R], list[Any]]
) -> R:
    """Await an acquire (a coroutine, run in a task, or an outcome already in flight); if
    the caller is cancelled meanwhile, let the server answer, release whatever it
    granted, then re-raise the cancellation."""
    outcome = work if isinstance(work, Outcome) else in_task(work)
    try:
        return await outcome
    except asyncio.CancelledError:
        await wait_settled(outcome)
        if outcome.exception() is None:  # else it failed, or was cancelled, on its own
            for lease in leases_of(outcome.result()):
                if lease is not None:
                    await lease.release()
        raise
