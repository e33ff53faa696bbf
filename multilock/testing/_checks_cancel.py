"""Checks that cancellation never leaks a lock: while holding, releasing or acquiring."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any

import pytest

from ._api import BaseCancel
from ._harness import Harness

__all__ = ["acquire_cancelled_leaks_nothing", "release_on_cancellation"]

_NO_SYNC_CANCEL = (
    "sync API: no cancellation can land inside a sync call;"
    " the sync unwinding is covered by test_release_on_cancellation[sync]"
)


async def release_on_cancellation(h: Harness) -> None:
    """A holder unwound by cancellation releases -- even when cancelled again mid-release.

    Async: a task inside ``async with lease:`` is cancelled, then cancelled again
    a few loop steps later (while its release may be in flight; a task group or
    ``asyncio.run`` tearing down does that). Sync: ``with lease:`` unwound by a
    ``BaseException`` (how ``KeyboardInterrupt`` or a thread's exit unwinds it).
    """
    locker = await h.api.connect()
    if h.kind == "sync":
        name = h.name("cancel-sync")
        lease = await h.api.try_acquire(locker, name)
        assert lease is not None
        with pytest.raises(BaseCancel):
            await h.api.unwind(lease, BaseCancel())
        await h.assert_free(name, "after a BaseException unwound its `with lease:` block")
        return
    for steps in (None, 0, 1, 2, 3, 5, 8, 13):
        name = h.name(f"cancel-{steps}")
        entered = asyncio.Event()

        async def job(lease: Any, entered: asyncio.Event = entered) -> None:
            async with lease:
                entered.set()
                await asyncio.Event().wait()

        lease = await h.api.try_acquire(locker, name)
        assert lease is not None
        task = asyncio.create_task(job(lease))
        await entered.wait()
        task.cancel()
        if steps is not None:  # cancel again while the release may be in flight
            for _ in range(steps):
                await asyncio.sleep(0)
            task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert task.cancelled(), "the cancelled holder did not end cancelled"
        await h.assert_free(
            name,
            "after its holder task was cancelled"
            + ("" if steps is None else f" and cancelled again {steps} loop steps later"),
        )


async def _cancel_at(
    start: Callable[[], Coroutine[Any, Any, Any]], steps: int, delay: float
) -> Any:
    """Start ``start()`` as a task, cancel it after ``steps`` loop steps and ``delay`` s;
    return what it returned if it finished first, else ``None``."""
    task = asyncio.create_task(start())
    for _ in range(steps):
        await asyncio.sleep(0)
    if delay:
        await asyncio.sleep(delay)
    task.cancel()
    outcome = (await asyncio.gather(task, return_exceptions=True))[0]
    if isinstance(outcome, BaseException):
        if not isinstance(outcome, asyncio.CancelledError):
            raise outcome
        return None
    return outcome


async def _schedule(h: Harness, locker: Any) -> list[tuple[int, float]]:
    """Cancellation points: loop steps 0..12, then delays spread over one acquire's time."""
    timings = []
    for i in range(5):
        lease = await h.api.try_acquire(locker, h.name(f"cancel-timing-{i}"))
        start = time.monotonic()
        await h.api.release(lease)
        timings.append(time.monotonic() - start)
    typical = statistics.median(timings)
    return [(steps, 0.0) for steps in range(13)] + [
        (0, typical * fraction) for fraction in (0.1, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0)
    ]


async def acquire_cancelled_leaks_nothing(h: Harness) -> None:
    """A cancellation landing while ``try_acquire`` (or ``try_acquire_many``) is in
    flight leaves nothing held -- at every point tried."""
    if h.kind == "sync":
        pytest.skip(_NO_SYNC_CANCEL)
    locker = await h.api.connect()
    for steps, delay in await _schedule(h, locker):
        point = f"cancelled after {steps} loop steps and {delay * 1000:.2f} ms"
        name = h.name(f"inflight-{steps}-{delay:.6f}")
        lease = await _cancel_at(partial(h.api.try_acquire, locker, name), steps, delay)
        if lease is not None:  # the acquire won the race: a normal lease, released normally
            assert await h.api.release(lease) is True
        await h.assert_free(name, f"after an in-flight try_acquire was {point}")
        names = [f"{name}-many-{i}" for i in range(3)]
        leases = await _cancel_at(partial(h.api.try_acquire_many, locker, names), steps, delay)
        for each in (leases or {}).values():
            if each is not None:
                await h.api.release(each)
        for each_name in names:
            await h.assert_free(each_name, f"after an in-flight try_acquire_many was {point}")
    # The locker is still usable after all of that.
    lease = await h.api.try_acquire(locker, h.name("inflight-after"))
    assert lease is not None
    assert await h.api.release(lease) is True
