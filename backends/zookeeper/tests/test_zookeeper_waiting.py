"""The waiting acquire on ZooKeeper: woken by an exists watch on the lock node."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import pytest

import multilock
from multilock.errors import LockTimeout
from multilock_zookeeper import ZooKeeperLocker


def _name() -> str:
    return f"waiting-{uuid.uuid4().hex[:12]}"


def test_release_wakes_the_watch(zookeeper_url: str) -> None:
    """A wait of 30 s ends with the node's deletion (the holder's release)."""
    name = _name()
    with multilock.connect(zookeeper_url) as holder, multilock.connect(zookeeper_url) as waiter:
        assert isinstance(waiter, ZooKeeperLocker)
        lease = holder.try_acquire(name)
        assert lease is not None
        assert waiter.try_acquire(name) is None  # connected, and the node is there
        with waiter.watch_released(name) as watch:
            releasing = threading.Timer(0.3, lease.release)
            releasing.start()
            start = time.monotonic()
            watch.wait(30)
            releasing.join()  # its reply read before the holder closes
            assert time.monotonic() - start < 10, "the watch slept its whole wait"


def test_a_node_gone_before_the_watch_ends_the_wait(zookeeper_url: str) -> None:
    """Released between the failed try and the watch: the wait ends at once."""
    name = _name()
    with multilock.connect(zookeeper_url) as waiter:
        assert isinstance(waiter, ZooKeeperLocker)
        lease = waiter.try_acquire(name)
        assert lease is not None
        lease.release()
        with waiter.watch_released(name) as watch:
            start = time.monotonic()
            watch.wait(30)
            assert time.monotonic() - start < 10


def test_async_release_wakes_the_watch(zookeeper_url: str) -> None:
    name = _name()

    async def scenario() -> None:
        async with multilock.connect_async(zookeeper_url) as waiter:
            with multilock.connect(zookeeper_url) as holder:
                lease = holder.try_acquire(name)
                assert lease is not None
                assert await waiter.try_acquire(name) is None
                async with waiter.watch_released(name) as watch:  # type: ignore[attr-defined]
                    releasing = threading.Timer(0.3, lease.release)
                    releasing.start()
                    await asyncio.wait_for(watch.wait(30), 10)
                    releasing.join()  # its reply read before the holder closes

    asyncio.run(scenario())


def test_waiters_leave_no_wake_up_behind(zookeeper_url: str) -> None:
    """Timed-out waits forget their wake-ups; the one watch they shared stays one."""
    name = _name()
    with multilock.connect(zookeeper_url) as holder, multilock.connect(zookeeper_url) as waiter:
        assert isinstance(waiter, ZooKeeperLocker)
        lease = holder.try_acquire(name)
        assert lease is not None
        for _ in range(3):
            with pytest.raises(LockTimeout):
                waiter.acquire(name, timeout=0.2)
        watches = waiter._session.watches
        assert watches._wakes == {}
        assert len(watches._armed) <= 1
        lease.release()
