"""The waiting acquire: ``acquire(name, timeout=..., ttl=...)`` waits for the holder,
times out leaving nothing behind, survives cancellation, and serves every waiter."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import pytest

from multilock.abc import Capability
from multilock.errors import ConfigurationError, LockTimeout, MultilockError

from ._api import TRY_LIMIT
from ._harness import Harness

__all__ = [
    "HANDOFF_BOUND",
    "WAITERS",
    "acquire_cancelled_leaves_nothing",
    "acquire_free_at_once",
    "acquire_times_out",
    "acquire_waits_for_release",
    "waiters_all_served",
]

HANDOFF_BOUND = 2.0
"""Seconds from a release to the waiter's grant: the kit polls at least every 0.25 s."""
TIMEOUT = 0.5
"""The timeout the timeout check waits; it must raise after it, and at most
:data:`HANDOFF_BOUND` later."""
WAITERS = 20
HOLD = 0.02
"""Seconds each of the :data:`WAITERS` holds the name once it has it."""
PER_WAITER = 0.5
"""Seconds each waiter may add to the time the whole queue takes (one handoff and its hold)."""


async def acquire_free_at_once(h: Harness) -> None:
    """A free name is granted at once, whatever the timeout (none, some, zero)."""
    locker = await h.api.connect()
    for label, timeout in (("none", None), ("some", 5.0), ("zero", 0)):
        name = h.name(f"free-{label}")
        start = time.monotonic()
        lease = await h.api.acquire(locker, name, timeout=timeout, limit=TRY_LIMIT)
        took = time.monotonic() - start
        assert lease is not None, f"acquire(timeout={timeout}) gave None"
        assert lease.held, f"acquire(timeout={timeout}) gave {lease!r}"
        assert lease.name == name
        await h.assert_held(name, f"while acquire(timeout={timeout})'s lease is held")
        assert await h.api.release(lease) is True
        await h.assert_free(name, f"after acquire(timeout={timeout})'s lease was released")
        assert took < TRY_LIMIT, f"acquire on a free name took {took:.2f} s"


async def acquire_waits_for_release(h: Harness) -> None:
    """A waiter on a held name gets it soon after the holder releases, not before."""
    holder_locker, waiter_locker = await h.api.connect(), await h.api.connect()
    name = h.name("waits")
    held = await h.api.try_acquire(holder_locker, name)
    assert held is not None
    waiter = asyncio.ensure_future(h.api.acquire(waiter_locker, name, timeout=30, limit=40))
    try:
        await asyncio.sleep(0.3)  # the waiter is at its tries: it must still be waiting
        assert not waiter.done(), f"acquire on a held name returned {_outcome(waiter)}"
        assert await h.api.release(held) is True
        released = time.monotonic()
        lease = await waiter
    finally:
        await _settle([waiter])
    took = time.monotonic() - released
    assert lease is not None
    assert lease.held
    assert took <= HANDOFF_BOUND, (
        f"the waiter got the name {took:.2f} s after its release (bound {HANDOFF_BOUND:g} s)"
    )
    if h.has(Capability.FENCING):
        assert lease.fencing_token > held.fencing_token, "the waiter's fencing token is not larger"
    await h.assert_held(name, "while the waiter holds it")
    assert await h.api.release(lease) is True
    await h.assert_free(name, "after the waiter released it")


async def acquire_times_out(h: Harness) -> None:
    """A wait longer than its timeout raises LockTimeout in about the timeout, and leaves
    nothing held or queued: the name is free the moment its holder releases it."""
    holder_locker, waiter_locker = await h.api.connect(), await h.api.connect()
    name = h.name("timeout")
    held = await h.api.try_acquire(holder_locker, name)
    assert held is not None
    for label, locker, timeout in (
        ("another locker", waiter_locker, TIMEOUT),
        ("the holder's own locker", holder_locker, TIMEOUT),
        ("another locker, timeout=0", waiter_locker, 0),
    ):
        start = time.monotonic()
        with pytest.raises(LockTimeout) as raised:
            await h.api.acquire(locker, name, timeout=timeout)
        took = time.monotonic() - start
        assert isinstance(raised.value, TimeoutError)
        assert isinstance(raised.value, MultilockError)
        assert took >= timeout * 0.9, f"{label}: LockTimeout after {took:.2f} s of {timeout} s"
        assert took <= timeout + HANDOFF_BOUND, (
            f"{label}: LockTimeout after {took:.2f} s of a {timeout} s timeout"
        )
        await h.assert_held(name, f"after {label}'s acquire timed out")
    with pytest.raises(ConfigurationError):
        await h.api.acquire(waiter_locker, name, timeout=-1)
    assert await h.api.release(held) is True
    await h.assert_free(name, "right after its holder released it, the waits having timed out")
    again = await h.api.try_acquire(waiter_locker, name)
    assert again is not None, "the locker whose wait timed out cannot take the free name"
    assert await h.api.release(again) is True


async def acquire_cancelled_leaves_nothing(h: Harness) -> None:
    """A cancelled wait leaves nothing held or queued: cancelled while the name is held,
    and cancelled right as the holder releases (the grant may land meanwhile)."""
    if h.kind == "sync":
        pytest.skip("sync API: no cancellation can land inside a sync call")
    holder_locker, waiter_locker = await h.api.connect(), await h.api.connect()
    name = h.name("cancel-wait")
    held = await h.api.try_acquire(holder_locker, name)
    assert held is not None
    for delay in (0.0, 0.001, 0.01, 0.05, 0.3):
        waiter = asyncio.ensure_future(h.api.acquire(waiter_locker, name, limit=40))
        await asyncio.sleep(delay)
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        assert waiter.cancelled(), f"the wait cancelled after {delay} s: {_outcome(waiter)}"
    assert await h.api.release(held) is True
    await h.assert_free(name, "after its holder released it, the waits having been cancelled")
    for steps in (0, 1, 2, 3, 5, 8, 13):
        held = await h.api.try_acquire(holder_locker, name)
        assert held is not None, f"the name is not free before round {steps}"
        waiter = asyncio.ensure_future(h.api.acquire(waiter_locker, name, limit=40))
        await asyncio.sleep(0.05)
        assert await h.api.release(held) is True
        for _ in range(steps):
            await asyncio.sleep(0)
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        if not waiter.cancelled():  # the grant won the race: a normal lease
            error = waiter.exception()
            if error is not None:
                raise error
            assert await h.api.release(waiter.result()) is True
        await h.assert_free(name, f"after a wait cancelled {steps} loop steps after a release")


async def waiters_all_served(h: Harness) -> None:
    """20 waiters on one name, each holding it briefly, all get it, one at a time,
    within a bound: no waiter starves while the others take turns."""
    name = h.name("queue")
    holder_locker = await h.api.connect()
    lockers = [await h.api.connect() for _ in range(WAITERS)]
    held = await h.api.try_acquire(holder_locker, name)
    assert held is not None
    bound = WAITERS * PER_WAITER + HANDOFF_BOUND
    inside, overlaps, served = 0, 0, []

    async def waiter(i: int, locker: Any) -> float:
        nonlocal inside, overlaps
        lease = await h.api.acquire(locker, name, timeout=bound * 2, limit=bound * 2 + 10)
        got = time.monotonic()
        inside += 1
        overlaps += inside > 1
        await asyncio.sleep(HOLD)
        inside -= 1
        served.append(i)
        assert await h.api.release(lease) is True
        return got

    tasks = [asyncio.ensure_future(waiter(i, locker)) for i, locker in enumerate(lockers)]
    try:
        await asyncio.sleep(0.3)  # every waiter is waiting
        early = [_outcome(task) for task in tasks if task.done()]
        assert not early, f"waiters returned while the name was held: {early}"
        assert await h.api.release(held) is True
        released = time.monotonic()
        grants = await asyncio.gather(*tasks)
    finally:
        await _settle(tasks)
    last = max(grants) - released
    assert overlaps == 0, f"{overlaps} waiters held the name at once"
    assert sorted(served) == list(range(WAITERS)), f"served: {served}"
    assert last <= bound, (
        f"the last of {WAITERS} waiters got the name {last:.2f} s after the first release"
        f" (bound {bound:g} s)"
    )
    await h.assert_free(name, f"after all {WAITERS} waiters released it")


async def _settle(futures: Sequence[asyncio.Future[Any]]) -> None:
    """Cancel what is still running of a check that failed, and read every outcome (no
    "exception never retrieved" at exit)."""
    for future in futures:
        future.cancel()
    await asyncio.gather(*futures, return_exceptions=True)


def _outcome(future: asyncio.Future[Any]) -> str:
    if not future.done():
        return "nothing yet"
    if future.cancelled():
        return "a cancellation"
    error = future.exception()
    return repr(error) if error is not None else repr(future.result())
