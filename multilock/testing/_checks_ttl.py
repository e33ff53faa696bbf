"""Checks of leases that end on their own: TTL expiry, renewal, stale holders, ``lost``."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import pytest

from multilock.abc import Capability
from multilock.errors import LockLost

from ._api import in_thread
from ._harness import Harness, eventually

__all__ = [
    "EXPIRY_SLACK",
    "LATE_SLACK",
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


def fences_newer(h: Harness, stale: object, fresh: object) -> None:
    """FENCING: the holder after a stale one carries a larger token -- what lets the
    protected resource refuse the stale holder's late writes."""
    if h.has(Capability.FENCING):
        old, new = getattr(stale, "fencing_token", stale), getattr(fresh, "fencing_token", fresh)
        assert isinstance(old, int), f"stale fencing_token {old!r}"
        assert isinstance(new, int), f"new fencing_token {new!r}"
        assert new > old, f"the next holder's fencing token {new} is not above the stale {old}"


EXPIRY_SLACK = 0.25
"""Seconds ``expires_at`` may be off the ttl asked for, and a lease may end before it."""
LATE_SLACK = 0.5
"""Seconds after ``expires_at`` (beyond the backend's own crash bound) by which another
locker must be granted the name."""


def _expiry_near(what: str, expires_at: Any, before: datetime, after: datetime, ttl: float) -> None:
    """``expires_at`` is ``ttl`` after the call that set it, within EXPIRY_SLACK."""
    assert expires_at is not None, f"{what}: expires_at is None on a TTL backend"
    low = before + timedelta(seconds=ttl - EXPIRY_SLACK)
    high = after + timedelta(seconds=ttl + EXPIRY_SLACK)
    assert low <= expires_at <= high, (
        f"{what}: expires_at is {(expires_at - after).total_seconds():+.3f} s from the call's"
        f" end, want {ttl:g} s (+-{EXPIRY_SLACK:g} s)"
    )


async def ttl_lease_expires(h: Harness) -> None:
    """expires_at is the ttl asked for, after acquire, extend(ttl) and extend() (which
    reuses the acquire's ttl); another locker is refused until then and granted after
    (not with RENEWAL); ``lost`` never fires after a clean release or close."""
    h.requires(Capability.TTL)
    now = partial(datetime.now, UTC)
    holder, closing, viewer = [await h.api.connect() for _ in range(3)]
    leases: dict[str, Any] = {}
    # How long the call that set each expiry took: the server's expiry may be anywhere
    # within it, so a grant that early before expires_at is no defect.
    took: dict[str, float] = {}
    for label, ttl, extend in (
        ("acquire", 1.5, None),
        ("many", 1.5, None),  # through try_acquire_many
        ("extend-ttl", 0.5, 1.5),
        ("extend", 1.0, 0.0),  # 0.0: extend() without a ttl
    ):
        before = now()
        name = h.name(f"time-{label}")
        if label == "many":
            lease = (await h.api.try_acquire_many(holder, [name], ttl=ttl))[name]
        else:
            lease = await h.api.try_acquire(holder, name, ttl=ttl)
        assert lease is not None
        after = now()
        _expiry_near(f"{label}: try_acquire(ttl={ttl:g})", lease.expires_at, before, after, ttl)
        if extend is not None:
            before = now()
            await h.api.extend(lease, extend or None)
            after = now()
            asked = extend or ttl
            shown = f"{extend:g}" if extend else ""
            call = f"extend({shown}) of a lease acquired with ttl={ttl:g}"
            _expiry_near(call, lease.expires_at, before, after, asked)
        leases[label] = lease
        took[label] = (after - before).total_seconds()
    quiet = [await h.api.try_acquire(holder, h.name("time-released"), ttl=SHORT_TTL)]
    quiet.append(await h.api.try_acquire(closing, h.name("time-closed"), ttl=SHORT_TTL))
    fired: list[str] = []
    for lease in quiet:
        assert lease is not None
        lease.lost.add_callback(fired.append)
    assert await h.api.release(quiet[0]) is True
    await h.api.close(closing)
    watch_until = time.monotonic() + SHORT_TTL + LATE_SLACK
    if not h.has(Capability.RENEWAL):
        late = LATE_SLACK + _extra_bound(h)
        pending = dict(leases)
        while pending:
            for label, lease in list(pending.items()):
                start = now()
                got = await h.api.try_acquire(viewer, lease.name)
                end = now()
                if got is None:
                    assert start <= lease.expires_at + timedelta(seconds=late), (
                        f"{label}: still refused {(start - lease.expires_at).total_seconds():.2f} s"
                        f" after expires_at"
                    )
                    continue
                early = (lease.expires_at - end).total_seconds()
                assert early <= EXPIRY_SLACK + took[label], (
                    f"{label}: granted {early:.2f} s before expires_at (the call that set it"
                    f" took {took[label]:.2f} s)"
                )
                del pending[label]
                assert await h.api.release(got) is True
            await asyncio.sleep(0.02)
    await asyncio.sleep(max(0.0, watch_until - time.monotonic()))  # the watch: nothing fires
    for lease, how in zip(quiet, ("released", "closed"), strict=True):
        assert not lease.lost.is_set(), f"lost fired on a lease {how} cleanly: {lease.lost.reason}"
    assert not fired, f"a lost callback ran after a clean release or close: {fired}"


def _extra_bound(h: Harness) -> float:
    """How much later than its ttl the backend says an unrenewed lease may be freed."""
    if h.hooks is None:
        return 0.0
    return max(0.0, float(h.hooks.crash_release_bound(h.lock_url, SHORT_TTL)) - SHORT_TTL)


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
