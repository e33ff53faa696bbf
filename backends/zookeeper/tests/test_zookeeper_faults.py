"""Faults on a private ZooKeeper: the server goes down and comes back, restarts, or freezes.

Nothing here touches the shared server: each test gets its own standalone
ZooKeeper on a free port (the ``private_zookeeper`` fixture), which it stops,
restarts and freezes (SIGSTOP: connections stay open, nothing answers) at will.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import pytest

import multilock
from multilock.errors import BackendUnavailable
from multilock.testing import apoll
from multilock.testing import poll as _poll
from multilock.testing._servers.zookeeper import PrivateZooKeeper

pytestmark = pytest.mark.faults

CONNECT_TIMEOUT = 1.0
PROMPT = CONNECT_TIMEOUT + 1.5  # what a failing call may take on a loaded machine
BOUND = 15.0


def poll(what: str, probe: Callable[[], Any], within: float = BOUND) -> Any:
    """Poll ``probe`` with this module's bound (see multilock.testing.poll)."""
    return _poll(what, probe, within, 0.05)


def test_server_down_loses_the_lease_raises_promptly_then_recovers(
    private_zookeeper: Callable[..., PrivateZooKeeper],
) -> None:
    server = private_zookeeper(keep_data=True)
    url = f"{server.url}?connect_timeout={CONNECT_TIMEOUT}&session_timeout=4s"
    with multilock.connect(url) as locker:
        # A JVM just started can be slow to open the first session on a busy machine.
        lease = poll("the first acquire", lambda: locker.try_acquire("job"))
        server.stop()
        assert lease.lost.wait(BOUND), "lost did not fire when the server went down"
        start = time.monotonic()
        with pytest.raises(BackendUnavailable, match="connecting within"):
            locker.try_acquire("job")
        assert time.monotonic() - start < PROMPT
        server.start()  # with its data: our session lives on, and so does the node we gave up
        # The locker deletes the node it gave up (suspended=lost) once reconnected.
        again = poll("re-acquiring after the server came back", lambda: locker.try_acquire("job"))
        assert again.fencing_token > lease.fencing_token
        assert lease.release() is False
        assert again.release() is True


def test_a_restart_within_the_session_keeps_the_lease_with_suspended_keep(
    private_zookeeper: Callable[..., PrivateZooKeeper],
) -> None:
    server = private_zookeeper(keep_data=True)
    # The grace (a sixth of the session timeout) must cover a JVM's restart.
    url = f"{server.url}?connect_timeout={CONNECT_TIMEOUT}&session_timeout=60s&suspended=keep"
    with multilock.connect(url) as locker, multilock.connect(url) as other:
        # A JVM just started can be slow to open the first session on a busy machine.
        lease = poll("the first acquire", lambda: locker.try_acquire("job"))
        server.stop()
        server.start()
        poll("the session back", lambda: locker.locks())  # type: ignore[attr-defined]
        assert not lease.lost.is_set()
        lease.extend()  # still our node, same czxid
        assert other.try_acquire("job") is None
        assert lease.release() is True
        assert poll("the lock free", lambda: other.try_acquire("job")) is not None


def test_suspended_keep_gives_the_lease_up_before_the_session_can_expire(
    private_zookeeper: Callable[..., PrivateZooKeeper],
) -> None:
    """A server gone silent (frozen: the connection stays open, nothing answers), as a
    cut network looks. kazoo only learns of an expiry by reconnecting, so without a
    bound ``suspended=keep`` would hold on after the server expired the session. The
    lease is lost a grace (T/6) after kazoo suspends the connection (at most 2T/3 after
    the server last heard from it): before the server can expire the session (T)."""
    timeout = 3.0
    server = private_zookeeper()
    url = f"{server.url}?connect_timeout={CONNECT_TIMEOUT}&session_timeout={timeout}&suspended=keep"
    with multilock.connect(url) as locker:
        lease = poll("the first acquire", lambda: locker.try_acquire("job"))
        server.freeze()
        frozen = time.monotonic()
        try:
            assert lease.lost.wait(BOUND), "lost never fired on a silent server"
            after = time.monotonic() - frozen
        finally:
            server.thaw()
        assert "grace" in str(lease.lost.reason)
        assert after < timeout, f"lost after {after:.2f}s: the session may expire after {timeout}s"


async def _frozen_calls(server: PrivateZooKeeper, url: str) -> dict[str, Any]:
    """Freeze the server under a connected async locker holding a lease; time an acquire,
    a cancelled acquire and a release; thaw; wait until another locker can take each name
    while the first one is still open (its own clean-up, not its session's end)."""
    seen: dict[str, Any] = {}
    async with multilock.connect_async(url) as locker, multilock.connect_async(url) as other:
        # A JVM just started can be slow to open the first session on a busy machine.
        lease = await apoll("the first acquire", partial(locker.try_acquire, "held"), BOUND)
        server.freeze()
        try:
            start = time.monotonic()
            try:
                await locker.try_acquire("cut")
            except BackendUnavailable as exc:
                seen["acquire"] = exc
            seen["acquire_s"] = time.monotonic() - start
            start = time.monotonic()
            cancelled = asyncio.ensure_future(locker.try_acquire("cancelled"))
            await asyncio.sleep(0)  # the create is in flight
            cancelled.cancel()
            try:
                await cancelled
            except asyncio.CancelledError:
                seen["cancelled"] = True
            seen["cancelled_s"] = time.monotonic() - start
            start = time.monotonic()
            seen["release"] = await lease.release()
            seen["release_s"] = time.monotonic() - start
        finally:
            server.thaw()
        for name in ("held", "cut", "cancelled"):
            taken = await apoll(f"{name!r} free", partial(other.try_acquire, name), BOUND)
            await taken.release()
    return seen


def test_async_calls_on_a_frozen_server_end_by_their_deadline_and_leave_nothing(
    private_zookeeper: Callable[..., PrivateZooKeeper],
) -> None:
    # The async acquire and release are awaited as futures with no task of their own
    # (the core's started path): their own deadline, not a task's, must end them.
    server = private_zookeeper()
    url = f"{server.url}?connect_timeout={CONNECT_TIMEOUT}&session_timeout=20s"
    seen = asyncio.run(_frozen_calls(server, url))
    assert isinstance(seen.get("acquire"), BackendUnavailable), seen
    assert seen.get("cancelled") is True, seen
    assert seen["release"] is False, seen  # unanswered: the locker deletes the node later
    for took in ("acquire_s", "cancelled_s", "release_s"):
        assert seen[took] < PROMPT, seen


async def _cancelled_in_flight(server: PrivateZooKeeper, url: str) -> dict[str, Any]:
    """Cancel an async acquire, then a release, while the server is frozen, and thaw it:
    each request is answered after its caller was cancelled. Whether the name is free
    the moment each cancellation has landed."""
    seen: dict[str, Any] = {}
    async with multilock.connect_async(url) as locker, multilock.connect_async(url) as other:
        # A JVM just started can be slow to open the first session on a busy machine.
        lease = await apoll("the first acquire", partial(locker.try_acquire, "held"), BOUND)
        calls: dict[str, Callable[[], Awaitable[object]]] = {
            "acquire": partial(locker.try_acquire, "job"),
            "release": lease.release,
        }
        for step, call in calls.items():
            server.freeze()
            try:
                task = asyncio.ensure_future(call())
                await asyncio.sleep(0)  # the request is in flight
                task.cancel()
            finally:
                server.thaw()
            try:
                await task
            except asyncio.CancelledError:
                seen[f"{step} cancelled"] = True
            name = "job" if step == "acquire" else "held"
            taken = await other.try_acquire(name)
            seen[f"{name} free"] = taken is not None
            if taken is not None:
                await taken.release()
    return seen


def test_async_calls_cancelled_in_flight_finish_before_the_cancellation_lands(
    private_zookeeper: Callable[..., PrivateZooKeeper],
) -> None:
    # A grant that arrives after its caller was cancelled is released, and a release
    # completes, before the caller sees the CancelledError (the core's Outcome).
    server = private_zookeeper()
    url = f"{server.url}?connect_timeout=5s&session_timeout=20s"
    seen = asyncio.run(_cancelled_in_flight(server, url))
    assert seen == {
        "acquire cancelled": True,
        "job free": True,
        "release cancelled": True,
        "held free": True,
    }
