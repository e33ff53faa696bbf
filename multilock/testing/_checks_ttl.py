"""Checks of leases that end on their own: TTL expiry, renewal, stale holders, ``lost``."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from multilock.abc import Capability
from multilock.errors import LockLost

from ._api import in_thread
from ._harness import Harness, eventually

__all__ = [
    "LOST_BOUND",
    "SHORT_TTL",
    "SLACK",
    "extend_keeps_lease",
    "fences_newer",
    "lost_signal",
    "renewal_keeps_long_job_exclusive",
    "ttl_lease_expires",
]

SHORT_TTL = 1.0
"""The ttl (seconds) of the leases these checks let expire."""
SLACK = 1.0
"""Seconds allowed on top of a backend's own bound (scheduling, round trips)."""
LOST_BOUND = 10.0
"""Seconds within which ``lost`` must fire after the backend dropped the lease."""

_RENEWS = (
    "backend declares Capability.RENEWAL, so a held lease does not expire; expiry of a"
    " stalled holder is checked by test_paused_holder_cannot_touch_new_holder"
)


async def _expire_and_take(h: Harness, label: str) -> tuple[Any, Any, str, float]:
    """Acquire with a short ttl, never extend, and take the name from another locker
    once it has expired. Returns the stale lease, the new one, the name and the delay."""
    h.requires(Capability.TTL)
    if h.has(Capability.RENEWAL):
        pytest.skip(_RENEWS)
    name = h.name(label)
    stale = await h.api.try_acquire(await h.api.connect(), name, ttl=SHORT_TTL)
    assert stale is not None
    start = time.monotonic()
    other = await h.api.connect()

    async def take() -> Any:
        return await h.api.try_acquire(other, name)

    fresh, elapsed = await eventually(
        f"a lease with ttl={SHORT_TTL} s expiring", take, SHORT_TTL + SLACK, interval=0.05
    )
    since = time.monotonic() - start
    assert since >= SHORT_TTL * 0.8, f"a lease with ttl={SHORT_TTL} s expired after {since:.2f} s"
    return stale, fresh, name, elapsed


def fences_newer(h: Harness, stale: object, fresh: object) -> None:
    """FENCING: the holder after a stale one carries a larger token -- what lets the
    protected resource refuse the stale holder's late writes."""
    if h.has(Capability.FENCING):
        old, new = getattr(stale, "fencing_token", stale), getattr(fresh, "fencing_token", fresh)
        assert isinstance(old, int), f"stale fencing_token {old!r}"
        assert isinstance(new, int), f"new fencing_token {new!r}"
        assert new > old, f"the next holder's fencing token {new} is not above the stale {old}"


async def ttl_lease_expires(h: Harness) -> None:
    """A lease that is neither released nor extended ends after its ttl, not before."""
    _stale, fresh, _name, _elapsed = await _expire_and_take(h, "expire")
    assert await h.api.release(fresh) is True


async def extend_keeps_lease(h: Harness) -> None:
    """Extending every ttl/4 keeps a lease exclusive for 2.5 ttls; expires_at moves."""
    h.requires(Capability.TTL)
    name = h.name("extend")
    lease = await h.api.try_acquire(await h.api.connect(), name, ttl=SHORT_TTL)
    assert lease is not None
    end = time.monotonic() + 2.5 * SHORT_TTL
    while time.monotonic() < end:
        before = lease.expires_at
        await h.api.extend(lease, SHORT_TTL)
        assert before is not None
        assert lease.expires_at is not None
        assert lease.expires_at > before, "extend() did not move expires_at forward"
        await h.assert_held(name, "while its holder keeps extending it")
        await asyncio.sleep(SHORT_TTL / 4)
    assert lease.held
    assert not lease.lost.is_set(), f"lease lost: {lease.lost.reason}"
    assert await h.api.release(lease) is True


async def renewal_keeps_long_job_exclusive(h: Harness) -> None:
    """A job running for several ttls keeps its lease without extending it -- also
    while it blocks its thread (sync) or its event loop (async)."""
    h.requires(Capability.TTL, Capability.RENEWAL)
    name = h.name("renew")
    lease = await h.api.try_acquire(await h.api.connect(), name, ttl=SHORT_TTL)
    assert lease is not None
    blocked = 1.5 * SHORT_TTL
    if h.kind == "sync":
        job = in_thread(lambda: time.sleep(blocked))  # a job blocking its worker thread
    else:
        time.sleep(blocked)  # noqa: ASYNC251  # a job blocking the event loop, renewal and all
    await h.assert_held(name, f"after a job blocked for {blocked:g} s (ttl {SHORT_TTL:g} s)")
    end = time.monotonic() + 2 * SHORT_TTL
    while time.monotonic() < end:
        await h.assert_held(name, "while its holder runs a long job")
        await asyncio.sleep(0.1)
    if h.kind == "sync":
        await job
    assert lease.held
    assert not lease.lost.is_set(), f"lease lost: {lease.lost.reason}"
    assert await h.api.release(lease) is True


async def lost_signal(h: Harness) -> None:
    """When the backend drops a lease, ``lost`` fires every way it can be observed; the
    name becomes free; the old lease can neither release nor extend the new holder's."""
    h.requires(Capability.LOST_SIGNAL)
    hooks = h.require_hooks("the LOST_SIGNAL check needs (break_lease)")
    name = h.name("lost")
    locker = await h.api.connect()
    # A short ttl: a TTL backend may only notice the loss when it next renews.
    lease = await h.api.try_acquire(locker, name, ttl=SHORT_TTL if h.has(Capability.TTL) else None)
    assert lease is not None
    reasons: list[str] = []
    lease.lost.add_callback(reasons.append)
    if h.kind == "sync":
        waiter: Any = in_thread(lambda: lease.lost.wait(LOST_BOUND))
    else:

        async def wait_lost() -> Any:
            return await lease.lost

        waiter = asyncio.create_task(wait_lost())
    await asyncio.sleep(0)
    assert not lease.lost.is_set(), "lost fired before the lease was broken"
    assert not reasons, "a lost callback ran before the lease was broken"
    try:
        await in_thread(lambda: hooks.break_lease(h.lock_url, locker, lease))
    except NotImplementedError:
        pytest.fail(
            "backend declares LOST_SIGNAL but ConformanceHooks.break_lease is not implemented",
            pytrace=False,
        )
    try:
        got = await asyncio.wait_for(waiter, LOST_BOUND + SLACK)
    except TimeoutError:
        got = None
    assert lease.lost.is_set(), f"lost did not fire within {LOST_BOUND:g} s of break_lease"
    if h.kind == "sync":
        assert got is True, "lost.wait() did not report the loss"
        assert lease.lost.wait(0) is True, "lost.wait(0) after the loss returned False"
    else:
        assert isinstance(got, str), f"`await lease.lost` returned {got!r}, not a reason"
        assert got, "`await lease.lost` returned an empty reason"
    await eventually("the lost callback", _truthy(reasons), SLACK)
    assert reasons == [lease.lost.reason], f"callbacks got {reasons}, want the reason once"
    assert lease.lost.reason, "a lost lease has no reason"
    assert not lease.held, "a lost lease still says held"
    late: list[str] = []
    lease.lost.add_callback(late.append)
    assert late, "a callback added after the loss was not called at once"
    other = await h.api.connect()

    async def take() -> Any:
        return await h.api.try_acquire(other, name)

    fresh, _ = await eventually("the broken lease's name becoming free", take, LOST_BOUND)
    fences_newer(h, lease, fresh)
    assert await h.api.release(lease) is False, "release() of a lost lease returned True"
    with pytest.raises(LockLost):
        await h.api.extend(lease)
    await h.assert_held(name, "by its new holder after the lost lease's release/extend")
    assert fresh.held
    assert await h.api.release(fresh) is True


def _truthy(items: list[str]) -> Any:
    async def probe() -> bool:
        return bool(items)

    return probe
