"""The waiting acquire on Redis: woken by the release's publication, not by a poll."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import redis

import multilock
from multilock_redis import RedisLocker, lock_key
from multilock_redis._sync._locker import RedisWatch


def test_release_wakes_the_watch(redis_url: str, name: str) -> None:
    """The release script publishes on the lock key's channel, which the watch waits on:
    a wait of 30 s ends with the release."""
    with multilock.connect(redis_url) as holder, multilock.connect(redis_url) as waiter:
        assert isinstance(waiter, RedisLocker)
        lease = holder.try_acquire(name)
        assert lease is not None
        with waiter.watch_released(name) as watch:
            start = time.monotonic()
            watch.wait(30)  # the first wait subscribes, and returns at once
            assert time.monotonic() - start < 10
            assert watch.wakes
            releasing = threading.Timer(0.2, lease.release)
            releasing.start()
            start = time.monotonic()
            watch.wait(30)
            releasing.join()  # its reply read before the holder closes
            assert time.monotonic() - start < 10, "the watch slept its whole wait"


def test_async_release_wakes_the_watch(redis_url: str, name: str) -> None:
    async def scenario() -> None:
        async with multilock.connect_async(redis_url) as waiter:
            with multilock.connect(redis_url) as holder:
                lease = holder.try_acquire(name)
                assert lease is not None
                async with waiter.watch_released(name) as watch:  # type: ignore[attr-defined]
                    await asyncio.wait_for(watch.wait(30), 10)  # subscribes, returns at once
                    assert watch.wakes
                    releasing = threading.Timer(0.2, lease.release)
                    releasing.start()
                    await asyncio.wait_for(watch.wait(30), 10)
                    releasing.join()  # its reply read before the holder closes

    asyncio.run(scenario())


def test_acquire_of_a_free_name_does_not_subscribe(redis_url: str, name: str) -> None:
    """The uncontended acquire costs no pub/sub connection: its watch never subscribes."""
    with multilock.connect(redis_url) as locker:
        assert isinstance(locker, RedisLocker)
        with locker.watch_released(name) as watch:
            pass
        assert isinstance(watch, RedisWatch)
        assert watch._pubsub is None
        with locker.acquire(name, timeout=1):
            pass


def test_no_subscription_outlives_the_wait(redis_url: str, name: str) -> None:
    """A wait that timed out leaves no subscriber on the channel (nothing queued)."""
    client = redis.Redis.from_url(redis_url)
    try:
        with multilock.connect(redis_url) as holder, multilock.connect(redis_url) as waiter:
            assert isinstance(waiter, RedisLocker)
            lease = holder.try_acquire(name)
            assert lease is not None
            with pytest.raises(multilock.errors.LockTimeout):
                waiter.acquire(name, timeout=0.2)
            channel = lock_key(name, waiter.prefix)
            assert client.pubsub_numsub(channel) == [(channel.encode(), 0)]
            lease.release()
    finally:
        client.close()
