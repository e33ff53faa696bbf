"""The started path (``_started``): taken once connected, and right in its rarer turns.

The conformance suite runs the lockers through it (cancellations included); these
tests pin that it is taken at all -- a fallback to the task path would be silent -- and
cover an acquire that meets a KV client's delete marker on the async API.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import nats

import multilock
from multilock_nats import AsyncNatsLease, AsyncNatsLocker


async def _connected(url: str) -> AsyncNatsLocker:
    locker = multilock.connect_async(url)
    assert isinstance(locker, AsyncNatsLocker)
    lease = await locker.try_acquire("warm-up")  # connects: the task path
    assert lease is not None
    await lease.release()
    return locker


def test_acquire_and_release_are_sent_at_once(make_url: Callable[..., str]) -> None:
    asyncio.run(_sent_at_once(make_url()))


async def _sent_at_once(url: str) -> None:
    locker = await _connected(url)
    async with locker:
        started = locker._start_try_acquire("job", 30.0)
        assert started is not None, "a connected locker's acquire took the task path"
        lease = await started
        assert isinstance(lease, AsyncNatsLease)
        assert lease.held
        assert (await locker.try_acquire("job")) is None
        released = lease.release_started()
        assert released is not None, "the release took the task path"
        assert await released
        assert not await lease.release()  # released already
        again = await locker.try_acquire("job")
        assert isinstance(again, AsyncNatsLease)
        assert again.fencing_token > lease.fencing_token
        await again.release()


def test_a_kv_delete_marker_does_not_hold_the_key(make_url: Callable[..., str]) -> None:
    asyncio.run(_over_a_marker(make_url()))


async def _over_a_marker(url: str) -> None:
    locker = await _connected(url)
    async with locker:
        lease = await locker.try_acquire("job")
        assert isinstance(lease, AsyncNatsLease)
        nc = await nats.connect(url.rsplit("/", 1)[0], allow_reconnect=False)
        try:
            kv = await nc.jetstream().key_value(locker.bucket)
            await kv.delete("job")
        finally:
            await nc.close()
        started = locker._start_try_acquire("job", 30.0)
        assert started is not None
        again = await started  # refused by the marker, then taken over it (in a task)
        assert isinstance(again, AsyncNatsLease)
        assert again.fencing_token > lease.fencing_token
        assert not await lease.release()
        assert await again.release()
